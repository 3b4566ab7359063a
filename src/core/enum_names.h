#pragma once
// The names of an enum whose enumerators count up from 0, in one table in the enumerators'
// order: the name of a value, the list of every name and the value of a name all read it,
// so they cannot disagree. Declared with the enum's count, and checked with complete(), a
// table that misses an enumerator does not compile:
//
//   constexpr EnumNames<MemoryKind, kMemoryKindCount> kMemoryKindNames{{"parameters", ...}, "?"};
//   static_assert(kMemoryKindNames.complete());
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace scalestudy {

template <typename Enum, size_t Count>
struct EnumNames {
  std::array<const char*, Count> names;
  const char* unknown;  // the name of a value outside the enum (read from a corrupt record)

  constexpr bool complete() const {
    for (const char* name : names)
      if (name == nullptr) return false;
    return true;
  }

  const char* name(Enum value) const {
    const auto index = static_cast<size_t>(value);
    return index < Count ? names[index] : unknown;
  }

  std::vector<std::string> all() const { return {names.begin(), names.end()}; }

  std::optional<Enum> find(const std::string& name) const {
    for (size_t i = 0; i < Count; ++i)
      if (name == names[i]) return static_cast<Enum>(i);
    return std::nullopt;
  }
};

}  // namespace scalestudy
