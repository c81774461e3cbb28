// engine/observe/tensorboard.cpp: see tensorboard.h. The protobuf wire format by hand:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
#include "engine/observe/tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>

#include "kernels/crc32c.h"
#include "common/user_error.h"

namespace retort::engine {
namespace {

enum WireType : uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(char(uint8_t(value) | 0x80));
    value >>= 7;
  }
  out.push_back(char(value));
}

void put_key(std::string& out, int field, WireType type) {
  put_varint(out, uint64_t(field) << 3 | type);
}

template <typename T>
void put_fixed(std::string& out, int field, WireType type, T value) {
  put_key(out, field, type);
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian, as x86 and the format are
  out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

std::string event_header(int64_t step) {
  std::string event;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  put_fixed(event, 1, kFixed64, now);
  put_key(event, 2, kVarint);
  put_varint(event, uint64_t(step));
  return event;
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const long seconds = long(std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(seconds) + "." +
                                         host + "." + std::to_string(getpid())))
              .string();
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) throw UserError("cannot create TensorBoard event file '" + path_ + "'");
  std::string first = event_header(0);
  put_bytes(first, 3, "brain.Event:2");
  write_record(first);
}

void TensorBoardWriter::write_scalars(int64_t step,
                                      const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string entry;
    put_bytes(entry, 1, tag);
    put_fixed(entry, 2, kFixed32, float(value));
    put_bytes(summary, 1, entry);
  }
  std::string event = event_header(step);
  put_bytes(event, 5, summary);
  write_record(event);
}

void TensorBoardWriter::write_record(const std::string& payload) {
  const uint64_t length = payload.size();
  char header[12];
  std::memcpy(header, &length, 8);
  const uint32_t length_crc = masked_crc32c(header, 8);
  std::memcpy(header + 8, &length_crc, 4);
  const uint32_t payload_crc = masked_crc32c(payload.data(), payload.size());
  out_.write(header, 12);
  out_.write(payload.data(), std::streamsize(payload.size()));
  out_.write(reinterpret_cast<const char*>(&payload_crc), 4);
  out_.flush();
  if (!out_) throw UserError("cannot write TensorBoard event file '" + path_ + "'");
}

}  // namespace retort::engine
