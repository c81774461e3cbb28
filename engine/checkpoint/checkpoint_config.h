// engine/checkpoint/checkpoint_config.h: the checkpoint.* keys: when to save, what to resume
// from. No torch here.
#pragma once
#include "common/config_fields.h"

namespace retort::engine {

#define RETORT_CHECKPOINT_KEYS(KEY)                                                        \
  KEY(int64_t, save_every, "checkpoint.save_every", 0, 0, 1e12,                            \
      "steps between saves, 0 = only at end")                                              \
  KEY(bool, save_at_end, "checkpoint.save_at_end", true, 0, 0, "save after the last step") \
  KEY(int64_t, keep_last, "checkpoint.keep_last", 0, 0, 1e9,                               \
      "keep only the newest K step checkpoints of run.dir, 0 = keep all")                  \
  KEY(std::string, load, "checkpoint.load", "", 0, 0,                                      \
      "checkpoint directory or run directory to resume from; auto = the newest complete "  \
      "checkpoint of run.dir that passes its checksums (fresh start if none); empty = fresh")

struct CheckpointConfig {
  RETORT_CHECKPOINT_KEYS(RETORT_FIELD)
};

}  // namespace retort::engine
