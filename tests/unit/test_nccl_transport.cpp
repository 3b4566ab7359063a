// NCCL's links: the settings of --link-emulation socket, and the transports read from
// NCCL's INFO log. The log lines are written here in the format NCCL prints them
// ("<host>:<pid>:<tid> [<dev>] NCCL INFO Channel <c>/<i> : <rank>[<dev>] -> <rank>[<dev>]
// [send|receive] via <transport>/<detail>").
#include <gtest/gtest.h>

#include <string>

#include "comm/nccl_transport.h"
#include "core/usage_error.h"
#include "results/provenance.h"

namespace scalestudy {
namespace {

using Transports = std::set<std::string>;

TEST(NcclTransport, ReadsEachTransportFromItsConnectionLines) {
  const std::string p2p =
      "node-a:4100:4162 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read\n"
      "node-a:4100:4162 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n";
  EXPECT_EQ(parse_nccl_transports(p2p), Transports{"P2P"});
  const std::string socket =
      "node-a:4100:4162 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0\n"
      "node-a:4100:4162 [0] NCCL INFO Channel 00/0 : 1[1] -> 0[0] [receive] via NET/Socket/0\n";
  EXPECT_EQ(parse_nccl_transports(socket), Transports{"NET/Socket"});
  const std::string shm = "node-a:4101:4170 [1] NCCL INFO Channel 00 : 1[1] -> 0[0] via SHM/direct/direct\n";
  EXPECT_EQ(parse_nccl_transports(shm), Transports{"SHM"});
  const std::string ib =
      "node-b:77:90 [3] NCCL INFO Channel 02/0 : 3[3] -> 11[3] [send] via NET/IB/1/GDRDMA\n"
      "node-b:77:90 [3] NCCL INFO Channel 03/0 : 11[3] -> 3[3] [receive] via NET/IBext_v8/2\n";
  EXPECT_EQ(parse_nccl_transports(ib), (Transports{"NET/IB", "NET/IBext_v8"}));
}

TEST(NcclTransport, MixedLogsGiveTheUnionAndOtherLinesNothing) {
  const std::string log =
      "node-a:4100:4100 [0] NCCL INFO Bootstrap: Using lo:127.0.0.1<0>\n"
      "node-a:4100:4100 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>\n"
      "node-a:4100:4100 [0] NCCL INFO Using network Socket\n"
      "node-a:4100:4162 [0] NCCL INFO Channel 00/02 :    0   1\n"
      "node-a:4100:4162 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read\n"
      "node-a:4100:4162 [0] NCCL INFO Channel 00/0 : 0[0] -> 2[0] [send] via NET/Socket/0\n"
      "node-a:4100:4162 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 0\n"
      "node-a:4100:4162 [0] NCCL INFO NVLS multicast support is available on dev 0 (NVLS_NCHANNELS 16)\n"
      "node-a:4100:4162 [0] NCCL INFO comm 0x5577 rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0\n";
  EXPECT_EQ(parse_nccl_transports(log), (Transports{"NET/Socket", "P2P"}))
      << "the interface NCCL picks, its ring listing and NVLS support are no connection";
  EXPECT_TRUE(parse_nccl_transports("").empty());
  EXPECT_TRUE(parse_nccl_transports("node-a:1:1 [0] NCCL INFO Init COMPLETE\n").empty());
}

TEST(NcclTransport, NvlsAndCollNetAreNamedWhereNcclSetsThemUp) {
  const std::string nvls =
      "node-a:9:12 [0] NCCL INFO NVLS comm 0x55d1 headRank 0 nHeads 2 buffSize 1048576 memSize 2097152\n";
  EXPECT_EQ(parse_nccl_transports(nvls), Transports{"NVLS"});
  EXPECT_EQ(parse_nccl_transports("node-a:9:12 [0] NCCL INFO Connected NVLS tree\n"), Transports{"NVLS"});
  EXPECT_EQ(parse_nccl_transports("node-a:9:12 [0] NCCL INFO Connected CollNet chains\n"), Transports{"CollNet"});
}

TEST(NcclTransport, ListsAreSortedAndNoneWhenEmpty) {
  EXPECT_EQ(transport_list({}), "none");
  EXPECT_EQ(transport_list({"P2P", "NET/Socket"}), "NET/Socket,P2P");
  EXPECT_EQ(run_transports({"P2P", "NET/Socket,P2P"}), "NET/Socket,P2P");
  EXPECT_EQ(run_transports({"none", "none"}), "none");
  EXPECT_EQ(run_transports({"P2P", "unknown"}), "unknown") << "one rank unknown leaves the run's set unknown";
}

TEST(NcclTransport, WarningsAreTheWarnLines) {
  const std::string log =
      "node-a:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read\n"
      "node-a:1:2 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 127.0.0.1<4321> failed\n";
  const std::vector<std::string> warnings = nccl_warnings(log);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("socketStartConnect"), std::string::npos);
}

TEST(LinkEmulation, SetsTheSocketTransportAndLeavesNvlsAlone) {
  const auto settings = socket_emulation_settings({{"NCCL_NVLS_ENABLE", "0"}});
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"NCCL_P2P_DISABLE", "1"}, {"NCCL_SHM_DISABLE", "1"}, {"NCCL_NET", "Socket"},
      {"NCCL_IB_DISABLE", "1"},  {"NCCL_SOCKET_IFNAME", "lo"}};
  EXPECT_EQ(settings, expected);
}

TEST(LinkEmulation, KeepsAgreeingValuesAndTheUsersInterface) {
  const auto settings = socket_emulation_settings(
      {{"NCCL_P2P_DISABLE", "1"}, {"NCCL_NET", "socket"}, {"NCCL_SOCKET_IFNAME", "=eth0"}});
  const std::vector<std::pair<std::string, std::string>> expected = {{"NCCL_SHM_DISABLE", "1"},
                                                                     {"NCCL_IB_DISABLE", "1"}};
  EXPECT_EQ(settings, expected);
}

TEST(LinkEmulation, RefusesAContradictingVariableNamingItAndTheOption) {
  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"NCCL_P2P_DISABLE", "0"}, {"NCCL_SHM_DISABLE", "0"}, {"NCCL_NET", "IB"}, {"NCCL_IB_DISABLE", "0"}}) {
    try {
      socket_emulation_settings({{name, value}});
      ADD_FAILURE() << name << "=" << value << " was accepted";
    } catch (const UsageError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("--link-emulation socket"), std::string::npos) << message;
      EXPECT_NE(message.find(name + "=" + value), std::string::npos) << message;
    }
  }
}

}  // namespace
}  // namespace scalestudy
