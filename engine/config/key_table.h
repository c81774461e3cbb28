// engine/config/key_table.h: how a configuration key is declared once. Each config struct
// lists its keys in an X-macro next to the code that uses them:
//   #define RETORT_OPTIMIZER_KEYS(KEY)
//     KEY(double, lr, "optimizer.lr", 3e-3, 0, 10, "peak learning rate")
// (type, member, dotted path, default, min, max, help). RETORT_FIELD expands a list into
// the struct's members with their defaults; config_schema.cpp expands every list into the
// key table (type, default, range, choices, help, and where the value goes in TrainConfig),
// which drives parsing, validation, --help, --dry-run and make_train_config. Min and max
// bound numbers and list elements; other types ignore them. Enums (RETORT_NAMED_ENUM) take
// their choices from their enumerators. No torch here.
#pragma once
#include <cstdint>

#include "common/config_fields.h"

namespace retort::engine {

// An integer that may be written "auto" (stored as 0).
struct IntOrAuto {
  int64_t value = 0;
};

}  // namespace retort::engine
