// engine/observe/tensorboard.h: TensorBoard event files (events.out.tfevents.*) written
// without TensorFlow or protobuf: TFRecord framing (length, masked CRC-32C of the length,
// payload, masked CRC-32C of the payload) around hand-encoded `Event` messages, the first
// carrying file_version "brain.Event:2", each later one a `Summary` of scalar values
// (tag, simple_value) at a step. TensorBoard reads them as they are written. No torch here.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace retort::engine {

// TFRecord's checksum: CRC-32C rotated right by 15 bits plus 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);

class TensorBoardWriter {
 public:
  // Creates <dir>/events.out.tfevents.<seconds>.<host>.<pid> (a resumed run adds a file;
  // TensorBoard merges the files of one directory).
  explicit TensorBoardWriter(const std::string& dir);
  const std::string& path() const { return path_; }
  // One event at `step` holding every (tag, value) pair; flushed at once.
  void write_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

 private:
  void write_record(const std::string& payload);
  std::string path_;
  std::ofstream out_;
};

}  // namespace retort::engine
