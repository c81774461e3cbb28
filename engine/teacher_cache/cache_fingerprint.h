// engine/teacher_cache/cache_fingerprint.h: the fingerprint of a teacher cache, the named fields
// its values depend on beside its shape (seq_len, k, vocabulary): the data (every dataset's
// files read through a CRC, their weights and the validation split, which decides the training
// documents), the data order's seed, the temperature, the teacher's weights and the tokenizer.
// engine_teacher_cache records every field; a student compares those it can tell (a student
// that names no teacher checkpoint, or no tokenizer, cannot tell those).
#pragma once
#include <map>
#include <string>

#include "engine/config/train_config.h"

namespace retort::engine {

// teacher_identity (TeacherSource::identity) and tokenizer (its fingerprint): "" = unknown, left
// out.
std::map<std::string, std::string> cache_fingerprint(const TrainConfig& config,
                                                     const std::string& teacher_identity,
                                                     const std::string& tokenizer);

}  // namespace retort::engine
