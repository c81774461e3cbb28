// tests/unit/checkpoint_fault_test.cpp: checkpoints under faults. A process killed with
// SIGKILL inside a save (after writing its rank file; with the index written but the
// directory not renamed; renamed but "latest" not updated) leaves the previous checkpoint
// valid, and checkpoint.load=auto resumes from the newest complete one with exactly the losses
// of an uninterrupted run: no sample lost or repeated, optimizer and generator restored. A
// damaged rank file is refused with its file and tensor named, and auto falls back to the
// checkpoint before it.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "common/user_error.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/train/trainer.h"
#include "tests/support/scratch_dir.h"
#include "tests/unit/checkpoint_fault_config.h"

using namespace retort;
namespace fs = std::filesystem;

namespace {

std::string fresh(const std::string& name) {
  return retort::testing::scratch_dir("checkpoint_faults_" + name);
}

// Runs the crash helper; returns the signal that ended it (0 if it exited).
int run_crash_child(const std::string& dir, int kill_step, const std::string& point) {
  const std::string step = std::to_string(kill_step);
  std::vector<char*> args = {const_cast<char*>(RETORT_CRASH_CHILD), const_cast<char*>(dir.c_str()),
                             const_cast<char*>(step.c_str()), const_cast<char*>(point.c_str()),
                             nullptr};
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, RETORT_CRASH_CHILD, nullptr, nullptr, args.data(), environ), 0);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

std::vector<double> losses_until(engine::Trainer& trainer, int64_t last_step) {
  std::vector<double> losses;
  while (trainer.step() < last_step) losses.push_back(trainer.train_step().loss);
  return losses;
}

}  // namespace

TEST(CheckpointFaults, AKilledSaveLeavesThePreviousCheckpointAndAutoResumesExactly) {
  engine::Trainer straight(test::crash_test_config(fresh("straight"), {}), nullptr);
  const std::vector<double> all = losses_until(straight, 6);
  struct Case {
    const char* point;
    int64_t resumes_at;  // the newest complete checkpoint after the kill
  };
  for (const Case& c :
       {Case{"after_rank_files", 2}, Case{"before_rename", 2}, Case{"before_latest", 4}}) {
    const std::string dir = fresh(c.point);
    EXPECT_EQ(run_crash_child(dir, 4, c.point), SIGKILL) << c.point;
    const std::vector<std::string> complete = engine::complete_checkpoints(dir);
    ASSERT_FALSE(complete.empty()) << c.point;
    EXPECT_EQ(complete.front(), engine::checkpoint_path(dir, c.resumes_at)) << c.point;
    engine::Trainer resumed(test::crash_test_config(dir, {"checkpoint.load=auto"}), nullptr);
    EXPECT_EQ(resumed.step(), c.resumes_at) << c.point;
    const std::vector<double> rest = losses_until(resumed, 6);
    const std::vector<double> want(all.begin() + c.resumes_at, all.end());
    EXPECT_EQ(rest, want) << c.point;  // bitwise: the same samples, the same state
  }
}

TEST(CheckpointFaults, ADamagedCheckpointIsNamedAndAutoFallsBack) {
  const std::string dir = fresh("damaged");
  {
    engine::Trainer t(test::crash_test_config(dir, {"training.steps=4", "checkpoint.save_every=2"}),
                      nullptr);
    t.run();
  }
  const std::string newest = engine::checkpoint_path(dir, 4);
  const fs::path file = fs::path(newest) / "rank_00000.h5";
  haddr_t offset = HADDR_UNDEF;
  {  // where the embedding's bytes lie in the file
    const hid_t h5 = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    const hid_t set = H5Dopen2(h5, "/params/embed.weight", H5P_DEFAULT);
    offset = H5Dget_offset(set);
    H5Dclose(set);
    H5Fclose(h5);
  }
  ASSERT_NE(offset, HADDR_UNDEF);
  {  // flip one byte of it
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(offset + 100));
    char byte = 0;
    f.read(&byte, 1);
    byte = char(byte ^ 0x5A);
    f.seekp(std::streamoff(offset + 100));
    f.write(&byte, 1);
  }
  try {
    engine::Trainer t(test::crash_test_config(dir, {"checkpoint.load=" + newest}), nullptr);
    ADD_FAILURE() << "a damaged checkpoint loaded";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(file.string()), std::string::npos) << message;
    EXPECT_NE(message.find("fails its checksum"), std::string::npos) << message;
    EXPECT_NE(message.find("tensor '"), std::string::npos) << message;
  }
  engine::Trainer fallback(test::crash_test_config(dir, {"checkpoint.load=auto"}), nullptr);
  EXPECT_EQ(fallback.step(), 2);
  // A truncated rank file is named too.
  fs::resize_file(file, fs::file_size(file) / 2);
  try {
    engine::Trainer t(test::crash_test_config(dir, {"checkpoint.load=" + newest}), nullptr);
    ADD_FAILURE() << "a truncated checkpoint loaded";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("rank_00000.h5"), std::string::npos) << e.what();
  }
}
