// common/config_fields.h: RETORT_FIELD, the expansion that turns a config struct's key list
// (an X-macro of KEY(type, member, "dotted.path", default, min, max, "help") entries, see
// engine/config/key_table.h) into its members with their defaults. Plain C++.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/named_enum.h"

namespace retort {
// For a range without a bound.
constexpr double kUnbounded = 1e308;
}  // namespace retort

#define RETORT_FIELD(type, member, path, default_value, min, max, help) type member = default_value;
