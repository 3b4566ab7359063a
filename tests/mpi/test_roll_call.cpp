// The roll call at 1 to 4 ranks: a rank that has not entered the control collective the
// others are in is named as behind, whatever it is doing meanwhile (here, waiting in a
// plain MPI_Barrier, as a rank stuck in another collective would); every rank that
// answers is kept off the silent list; and the lowest rank that responds is the one to
// report. A rank that cannot answer at all (SIGSTOP) is tests/scripts/test_faults.sh's.
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "control/mpi_check.h"
#include "control/control_wait.h"
#include "control/roll_call.h"

namespace scalestudy {
namespace {

struct World {
  int rank = 0;
  int size = 1;
};

World world() {
  World w;
  CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &w.rank));
  CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &w.size));
  return w;
}

TEST(RollCall, NamesTheRankThatDidNotArriveAndNoneThatAnswers) {
  const World w = world();
  control_barrier(MPI_COMM_WORLD, "roll call test");  // every count the same from here
  const int64_t before = control_collectives_entered();
  const int last = w.size - 1;
  if (w.rank != last) {
    EXPECT_EQ(enter_control_collective(MPI_COMM_WORLD), before + 1);
  }
  // The ranks between the first and the last tell rank 0 that they have entered, so that
  // its roll call finds them there however late a loaded machine schedules them; the last
  // rank waits in the barrier below, outside the control plane, while rank 0 takes it.
  constexpr int kEnteredTag = 1;
  if (w.rank != 0 && w.rank != last) {
    CHECK_MPI(MPI_Send(nullptr, 0, MPI_BYTE, 0, kEnteredTag, MPI_COMM_WORLD));
  }
  if (w.rank == 0) {
    for (int peer = 1; peer < last; ++peer) {
      CHECK_MPI(MPI_Recv(nullptr, 0, MPI_BYTE, peer, kEnteredTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    }
    const RollCall roll_call = take_roll_call(before + 1);
    if (w.size == 1) {
      EXPECT_FALSE(roll_call.taken) << "one rank has no one to ask";
    } else {
      EXPECT_TRUE(roll_call.taken);
      EXPECT_EQ(roll_call.behind, std::vector<int>{last});
      EXPECT_TRUE(roll_call.silent.empty()) << describe_roll_call(roll_call, "");
      EXPECT_EQ(describe_roll_call(roll_call, "none"),
                "rank " + std::to_string(last) + " did not arrive (it responds: slow, or stuck elsewhere)");
      EXPECT_TRUE(is_reporting_rank(roll_call));
    }
  }
  CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
  if (w.rank == last && w.size > 1) {
    EXPECT_EQ(enter_control_collective(MPI_COMM_WORLD), before + 1);
  }
  CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
  // Now every rank has arrived: the last rank takes the roll call, and leaves reporting to
  // rank 0, which responds.
  if (w.rank == last && w.size > 1) {
    const RollCall roll_call = take_roll_call(before + 1);
    EXPECT_TRUE(roll_call.behind.empty()) << describe_roll_call(roll_call, "");
    EXPECT_TRUE(roll_call.silent.empty()) << describe_roll_call(roll_call, "");
    EXPECT_EQ(describe_roll_call(roll_call, "every rank arrived"), "every rank arrived");
    EXPECT_FALSE(is_reporting_rank(roll_call));
  }
  CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
}

TEST(RollCall, CountsOnlyCollectivesOfEveryRank) {
  const World w = world();
  const int64_t before = control_collectives_entered();
  EXPECT_EQ(enter_control_collective(MPI_COMM_SELF), w.size == 1 ? before + 1 : 0);
  EXPECT_EQ(control_collectives_entered(), w.size == 1 ? before + 1 : before);
}

TEST(RollCall, ListsRanksAsRanges) {
  EXPECT_EQ(rank_list({3}), "rank 3");
  EXPECT_EQ(rank_list({7, 2, 5, 6}), "ranks 2, 5-7");
  EXPECT_EQ(rank_list({0, 1}), "ranks 0-1");
  EXPECT_EQ(rank_list({4, 4, 9}), "ranks 4, 9");
  RollCall stopped;
  stopped.taken = true;
  stopped.silent = {3};
  stopped.behind = {1, 2};
  EXPECT_EQ(describe_roll_call(stopped, ""),
            "rank 3 does not respond (stopped or gone); ranks 1-2 did not arrive (they respond: slow, or stuck "
            "elsewhere)");
  EXPECT_EQ(describe_roll_call(RollCall{}, "all"), "") << "a roll call never taken says nothing";
  stopped.caller = 2;
  stopped.silent = {0, 1};
  EXPECT_TRUE(is_reporting_rank(stopped)) << "every lower rank is silent";
  stopped.silent = {0};
  EXPECT_FALSE(is_reporting_rank(stopped)) << "rank 1 responds and reports";
}

}  // namespace
}  // namespace scalestudy
