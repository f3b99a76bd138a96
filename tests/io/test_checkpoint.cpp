// Parallel-HDF5 checkpoints: bit-exact round trips, collective transfers, atomic writes, detection of
// missing/truncated/corrupt/foreign files, the path helpers, the checkpoint schedule, and readability
// with h5dump.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "base/checksum.hpp"
#include "src/io/checkpoint.hpp"
#include "src/io/h5.hpp"
#include "tests/common/mpi_scratch.hpp"

namespace fastudy {
namespace {

namespace fs = std::filesystem;
using mpi::Comm;
using testing_mpi::make_state;
using testing_mpi::scratch_dir;

void expect_same(const std::vector<NamedArray>& a, const std::vector<NamedArray>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].shape, b[i].shape) << a[i].name;
    EXPECT_EQ(a[i].dtype, b[i].dtype) << a[i].name;
    EXPECT_TRUE(a[i].data == b[i].data) << a[i].name << ": bytes differ";
  }
}

void expect_same(const TrainState& a, const TrainState& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.data_cursor, b.data_cursor);
  EXPECT_EQ(a.loss_scale, b.loss_scale);
  EXPECT_EQ(a.good_steps, b.good_steps);
  expect_same(a.params, b.params);
  expect_same(a.optimizer, b.optimizer);
  expect_same(a.extra, b.extra);
  ASSERT_EQ(a.loss_history.size(), b.loss_history.size());
  EXPECT_EQ(0, std::memcmp(a.loss_history.data(), b.loss_history.data(), a.loss_history.size() * sizeof(double)));
  EXPECT_EQ(a.attrs, b.attrs);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Runs f on rank 0 only and rethrows nothing: other ranks wait at the barrier.
template <class F> void on_root(const Comm& c, F&& f) {
  if (c.is_root()) f();
  c.barrier();
}

TEST(Checkpoint, RoundTripIsBitExactAndCollective) {
  Comm world = Comm::world();
  const std::string dir = scratch_dir(world, "roundtrip");
  const std::string path = checkpoint_path(dir, "flash-bf16-s1", 40);
  EXPECT_EQ(path, dir + "/checkpoints/flash-bf16-s1/step_0000040.h5");
  const TrainState s = make_state(40);
  CheckpointOptions split_all;
  split_all.split_bytes = 0;  // every tensor split over the ranks, however small
  const CheckpointWriteStats stats = write_checkpoint(world, path, s, split_all);
  EXPECT_TRUE(fs::exists(path));
  EXPECT_EQ(stats.datasets, 11);  // 6 params, 2 optimizer, 2 extra, loss_history
  // Every transfer went through MPI-IO's collective path (H5Pget_mpio_actual_io_mode), on every rank.
  EXPECT_EQ(stats.transfers, 10);  // the empty tensor has no storage
  EXPECT_EQ(stats.collective_transfers, stats.transfers);
  expect_same(read_checkpoint(path), s);
  expect_same(read_checkpoint(world, path), s);
  const CheckpointInfo info = read_checkpoint_info(path);
  EXPECT_EQ(info.step, 40);
  EXPECT_EQ(info.data_cursor, s.data_cursor);
  EXPECT_EQ(info.attrs, s.attrs);
  // No temporary file is left behind: the checkpoint and its checksum sidecar only.
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path())) {
    EXPECT_TRUE(e.path().string() == path || e.path().string() == checksum_path(path)) << e.path();
  }
  EXPECT_FALSE(checksum_problem(path).has_value());
  // Independent transfers (CheckpointOptions::collective = false) write the same bytes.
  CheckpointOptions independent = split_all;
  independent.collective = false;
  const std::string path_ind = checkpoint_path(dir, "flash-bf16-s1", 41);
  const CheckpointWriteStats ind = write_checkpoint(world, path_ind, s, independent);
  EXPECT_EQ(ind.collective_transfers, 0);
  expect_same(read_checkpoint(path_ind), s);
  // By default tensors under 1 MiB (all of this state's) are written whole by rank 0 alone; a
  // 1 MiB tensor is split and written collectively.
  TrainState big = s;
  big.params.push_back(testing_mpi::make_array("big.weight", {256, 1024}, DType::f32, 3));
  const std::string path_def = checkpoint_path(dir, "flash-bf16-s1", 42);
  const CheckpointWriteStats def = write_checkpoint(world, path_def, big);
  EXPECT_EQ(def.collective_transfers, 1);
  EXPECT_EQ(def.transfers, world.is_root() ? 11 : 1);
  expect_same(read_checkpoint(path_def), big);
  // Overwriting the same step replaces the file whole.
  const TrainState s2 = make_state(40, 99);
  write_checkpoint(world, path, s2);
  expect_same(read_checkpoint(path), s2);
}

std::string pattern_bytes(std::size_t n, std::uint32_t seed) {
  std::string out(n, '\0');
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<char>(((i + seed) * 2654435761u) >> 23);
  return out;
}

TEST(Checksum, FileSumWithKnownRangesEqualsTheWholeFileRead) {
  Comm world = Comm::world();
  const std::string dir = scratch_dir(world, "known");
  on_root(world, [&] {
    const std::string path = dir + "/f.bin";
    const std::string bytes = pattern_bytes(100000, 3);
    spit(path, bytes);
    const FileSum read = file_sum(path);
    auto range = [&](std::size_t at, std::size_t n) {
      return KnownRange{at, n, crc32_update(0, bytes.data() + at, n)};
    };
    // In any order, touching each other, at the start and the end, empty ranges ignored.
    const FileSum spliced = file_sum_known(path, {range(90000, 10000), range(0, 4096), range(4096, 5), range(50000, 0)});
    EXPECT_EQ(spliced.size, read.size);
    EXPECT_EQ(spliced.crc, read.crc);
    EXPECT_EQ(file_sum_known(path, {}).crc, read.crc);
    // A range past the end is read instead of trusted.
    KnownRange past = range(99000, 1000);
    past.size = 5000;
    past.crc = 0;
    EXPECT_EQ(file_sum_known(path, {past}).crc, read.crc);
    // A known CRC that is not the file's bytes gives a sum that is not the file's: the file then
    // fails its sidecar check.
    KnownRange wrong = range(2000, 3000);
    wrong.crc ^= 1;
    EXPECT_NE(file_sum_known(path, {wrong}).crc, read.crc);
    EXPECT_THROW(file_sum_known(path, {range(0, 100), range(50, 100)}), Error);
  });
}

TEST(Checkpoint, SidecarOfAnUnverifiedWriteMatchesTheFile) {
  // Without the verification pass (and without fsync) the sidecar is still the CRC-32 of the file's
  // bytes: the datasets' CRCs spliced with the metadata read back equal a full read.
  Comm world = Comm::world();
  const std::string dir = scratch_dir(world, "unverified");
  TrainState s = make_state(12);
  s.params.push_back(testing_mpi::make_array("big.weight", {256, 1024}, DType::f32, 5));
  for (bool collective : {true, false}) {
    CheckpointOptions fast;
    fast.verify = false;
    fast.fsync = false;
    fast.collective = collective;
    const std::string path = checkpoint_path(dir, "v", collective ? 1 : 2);
    write_checkpoint(world, path, s, fast);
    on_root(world, [&] {
      EXPECT_FALSE(checksum_problem(path).has_value()) << *checksum_problem(path);
      expect_same(read_checkpoint(path), s);
    });
  }
}

TEST(Checkpoint, GroupsWriteTheirOwnFilesConcurrently) {
  Comm world = Comm::world();
  const std::string dir = scratch_dir(world, "groups");
  const int per_group = world.size() >= 2 ? 2 : 1;
  if (world.size() % per_group != 0) GTEST_SKIP();
  Comm group = world.split(world.rank() / per_group, world.rank());
  const int g = world.rank() / per_group;
  const std::string variant = "v" + std::to_string(g);
  const TrainState s = make_state(10 + g, static_cast<std::uint32_t>(g));
  write_checkpoint(group, checkpoint_path(dir, variant, s.step), s);
  world.barrier();
  for (int h = 0; h < world.size() / per_group; ++h) {
    expect_same(read_checkpoint(checkpoint_path(dir, "v" + std::to_string(h), 10 + h)),
                make_state(10 + h, static_cast<std::uint32_t>(h)));
  }
}

TEST(Checkpoint, ReadParamsSelectsByName) {
  Comm world = Comm::world();
  const std::string dir = scratch_dir(world, "params");
  const std::string path = dir + "/p.h5";
  const TrainState s = make_state(3);
  write_checkpoint(world, path, s, CheckpointOptions{false, false});
  expect_same(read_params(path), s.params);
  std::vector<NamedArray> two = read_params(path, {"head.weight", "tok_emb.weight"});
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].name, "head.weight");
  EXPECT_EQ(two[0].dtype, DType::f64);
  EXPECT_TRUE(two[1].data == s.params[0].data);
  try {
    read_params(path, {"nope.weight"});
    FAIL() << "no exception";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(e.dataset(), "/params/nope.weight");
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
}

TEST(Checkpoint, InconsistentStatesAcrossRanksAreRefused) {
  Comm world = Comm::world();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = scratch_dir(world, "inconsistent");
  TrainState s = make_state(5);
  if (world.rank() == 1) s.params[1].name = "blocks.0.attn.qkv.weight2";
  EXPECT_THROW(write_checkpoint(world, dir + "/x.h5", s), UsageError);
  EXPECT_FALSE(fs::exists(dir + "/x.h5"));
}

TEST(Checkpoint, MissingTruncatedCorruptAndForeignFilesAreClearErrors) {
  Comm world = Comm::world();
  const std::string dir = scratch_dir(world, "bad");
  const std::string good = dir + "/good.h5";
  TrainState s = make_state(8);
  // A parameter with a pattern we can find in the file to damage exactly one dataset.
  for (std::size_t i = 0; i < s.params[1].data.size(); ++i) s.params[1].data[i] = static_cast<std::byte>(0xA5);
  write_checkpoint(world, good, s);
  on_root(world, [&] {
    auto expect_error = [](const std::string& path, const std::string& words, const std::string& dataset) {
      try {
        read_checkpoint(path);
        ADD_FAILURE() << path << ": no exception";
      } catch (const CheckpointError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(path), std::string::npos) << what;
        EXPECT_NE(what.find(words), std::string::npos) << what;
        EXPECT_EQ(e.dataset(), dataset) << what;
        EXPECT_FALSE(e.hint().empty());
      }
    };
    expect_error(dir + "/missing.h5", "no such file", "");

    // Damage after the write is caught by the whole-file checksum before HDF5 opens the file.
    const std::string bytes = slurp(good);
    fs::copy_file(checksum_path(good), checksum_path(dir + "/truncated.h5"));
    spit(dir + "/truncated.h5", bytes.substr(0, bytes.size() / 2));
    expect_error(dir + "/truncated.h5", "truncated or extended", "");
    spit(dir + "/unsealed.h5", bytes);
    expect_error(dir + "/unsealed.h5", "no checksum file", "");
    std::string flipped = bytes;
    flipped[flipped.size() / 3] ^= 0x10;
    fs::copy_file(checksum_path(good), checksum_path(dir + "/flipped.h5"));
    spit(dir + "/flipped.h5", flipped);
    expect_error(dir + "/flipped.h5", "checksum mismatch", "");

    // Damage sealed with a fresh checksum (as if it happened before the seal) is still caught by
    // HDF5's checks and the per-dataset crc32.
    spit(dir + "/empty.h5", "");
    write_checksum(dir + "/empty.h5");
    expect_error(dir + "/empty.h5", "not an HDF5 file", "");
    std::string corrupt = bytes;
    const std::size_t at = corrupt.find(std::string(64, static_cast<char>(0xA5)));
    ASSERT_NE(at, std::string::npos);
    corrupt[at + 100] ^= 0x01;  // one bit of one weight
    spit(dir + "/corrupt.h5", corrupt);
    write_checksum(dir + "/corrupt.h5");
    expect_error(dir + "/corrupt.h5", "checksum mismatch", "/params/blocks.0.attn.qkv.weight");

    {
      h5::File f = h5::File::create(dir + "/future.h5", nullptr);
      f.root().set_attr("fastudy_format", std::string("fastudy-checkpoint/9"));
    }
    write_checksum(dir + "/future.h5");
    expect_error(dir + "/future.h5", "fastudy-checkpoint/9", "");
    {
      h5::File f = h5::File::create(dir + "/foreign.h5", nullptr);
      f.root().create_group("weights");
    }
    write_checksum(dir + "/foreign.h5");
    expect_error(dir + "/foreign.h5", "not a fastudy checkpoint", "");
  });
  // The collective read throws the same error on every rank.
  try {
    read_checkpoint(world, dir + "/corrupt.h5");
    FAIL() << "no exception";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(e.dataset(), "/params/blocks.0.attn.qkv.weight");
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
  }
}

// Every `every` steps below the last, and the last step always (the trainer's rule; reduce and
// `fastudy plan` read the same list).
TEST(Checkpoint, ScheduleIsEveryNStepsAndTheLastStep) {
  using Steps = std::vector<std::int64_t>;
  EXPECT_EQ(checkpoint_schedule(2, 4), (Steps{2, 4}));
  EXPECT_EQ(checkpoint_schedule(3, 10), (Steps{3, 6, 9, 10}));
  EXPECT_EQ(checkpoint_schedule(1, 3), (Steps{1, 2, 3}));
  EXPECT_EQ(checkpoint_schedule(5, 5), (Steps{5}));
  EXPECT_EQ(checkpoint_schedule(50, 7), (Steps{7}));  // every > steps: the last step only
  EXPECT_EQ(checkpoint_schedule(0, 7), (Steps{7}));   // no periodic checkpoints
  EXPECT_EQ(checkpoint_schedule(4, 0), (Steps{}));
  // The trainer asks is_checkpoint_step after each step: the steps it answers yes to are the schedule.
  for (std::int64_t every : {0, 1, 3, 5, 50})
    for (std::int64_t steps : {0, 1, 7, 10}) {
      Steps asked;
      for (std::int64_t s = 1; s <= steps; ++s)
        if (is_checkpoint_step(every, steps, s)) asked.push_back(s);
      EXPECT_EQ(asked, checkpoint_schedule(every, steps)) << "every " << every << ", steps " << steps;
    }
}

TEST(Checkpoint, TemporaryAndInvalidFilesAreNeverTakenAsValid) {
  Comm world = Comm::world();
  const std::string out = scratch_dir(world, "latest");
  const std::string dir = checkpoint_dir(out, "v");
  write_checkpoint(world, checkpoint_path(out, "v", 20), make_state(20));
  write_checkpoint(world, checkpoint_path(out, "v", 40), make_state(40));
  on_root(world, [&] {
    EXPECT_FALSE(latest_valid_checkpoint(out + "/nowhere").has_value());
    // A complete copy under a temporary name (a write killed before its rename) must not count,
    // nor a damaged newest checkpoint.
    fs::copy_file(checkpoint_path(out, "v", 40), checkpoint_path(out, "v", 60) + ".tmp.123-456");
    const std::string bytes = slurp(checkpoint_path(out, "v", 40));
    spit(checkpoint_path(out, "v", 50), bytes.substr(0, bytes.size() - 10));
    fs::copy_file(checksum_path(checkpoint_path(out, "v", 40)), checksum_path(checkpoint_path(out, "v", 50)));
    spit(dir + "/notes.txt", "not a checkpoint");
    EXPECT_EQ(list_checkpoint_steps(dir), (std::vector<std::int64_t>{20, 40, 50}));
    std::vector<std::string> skipped;
    auto latest = latest_valid_checkpoint(dir, &skipped);
    ASSERT_TRUE(latest.has_value());
    EXPECT_EQ(latest->step, 40);
    EXPECT_EQ(latest->path, checkpoint_path(out, "v", 40));
    ASSERT_EQ(skipped.size(), 2u);
    std::string all = skipped[0] + "\n" + skipped[1];
    EXPECT_NE(all.find("step_0000060.h5.tmp.123-456: temporary file"), std::string::npos) << all;
    EXPECT_NE(all.find("step_0000050.h5: checkpoint"), std::string::npos) << all;
    EXPECT_NE(all.find("truncated or extended"), std::string::npos) << all;
  });
  // A new write of step 60 removes the leftover temporary file of the interrupted one.
  write_checkpoint(world, checkpoint_path(out, "v", 60), make_state(60));
  on_root(world, [&] {
    EXPECT_FALSE(fs::exists(checkpoint_path(out, "v", 60) + ".tmp.123-456"));
    EXPECT_EQ(latest_valid_checkpoint(dir)->step, 60);
  });
  EXPECT_THROW(checkpoint_path(out, "v", 10000000), UsageError);
}

TEST(Checkpoint, H5dumpShowsTensorNames) {
  Comm world = Comm::world();
  const std::string dir = scratch_dir(world, "h5dump");
  const std::string path = dir + "/c.h5";
  write_checkpoint(world, path, make_state(2));
  on_root(world, [&] {
    if (std::system("h5dump --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "h5dump not installed";
    FILE* p = ::popen(("h5dump -H " + path).c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string text;
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) text.append(buf, n);
    EXPECT_EQ(::pclose(p), 0);
    for (const char* want : {"GROUP \"params\"", "DATASET \"blocks.0.attn.qkv.weight\"", "DATASET \"head.weight\"",
                             "DATASET \"tok_emb.weight.exp_avg\"", "DATASET \"loss_history\"",
                             "ATTRIBUTE \"crc32\"", "ATTRIBUTE \"variant\"", 
                             "H5T_IEEE_F32LE", "( 96, 32 )"}) {
      EXPECT_NE(text.find(want), std::string::npos) << "h5dump -H lacks " << want << "\n" << text;
    }
  });
}

TEST(Checkpoint, H5pyReadsNamesAttributesAndMatchingCrc32) {
  Comm world = Comm::world();
  // Python start-up costs seconds here: run in the 2-rank configuration only, where the checksum
  // combines two ranks' shares.
  if (world.size() != 2) GTEST_SKIP() << "runs with 2 ranks only";
  const std::string dir = scratch_dir(world, "h5py");
  const std::string path = dir + "/c.h5";
  CheckpointOptions split_all;
  split_all.split_bytes = 0;
  write_checkpoint(world, path, make_state(3), split_all);
  on_root(world, [&] {
    const std::string python = FASTUDY_PYTHON;
    if (python.empty() || std::system((python + " -c 'import h5py' > /dev/null 2>&1").c_str()) != 0) {
      GTEST_SKIP() << "python3 with h5py not available";
    }
    // The checksum attribute equals Python's zlib.crc32 of the tensor bytes: an independent check of
    // the partial-CRC combination across ranks.
    const std::string script =
        "import h5py, zlib\n"
        "f = h5py.File('" + path + "', 'r')\n"
        "assert f.attrs['fastudy_format'] == 'fastudy-checkpoint/1'\n"
        "assert f.attrs['variant'] == 'flash-bf16-s1' and f.attrs['step'] == 3\n"
        "assert list(f['params']) == ['tok_emb.weight', 'blocks.0.attn.qkv.weight', 'blocks.0.attn.qkv.bias',"
        " 'blocks.0.ln.gain', 'head.weight', 'a.scalar'], list(f['params'])\n"
        "assert f['params']['blocks.0.attn.qkv.weight'].shape == (96, 32)\n"
        "for sec in ('params', 'optimizer', 'extra'):\n"
        "    for name, d in f[sec].items():\n"
        "        assert d.attrs['crc32'] == zlib.crc32(d[()].tobytes()), (sec, name)\n"
        "assert list(f['loss_history'][()]) == [4.0, 2.0, 4.0 / 3 + 2e-17]\n";
    spit(dir + "/check.py", script);
    EXPECT_EQ(std::system((python + " " + dir + "/check.py").c_str()), 0) << script;
  });
}

TEST(H5, ErrorsNameCallFileObjectAndRank) {
  Comm world = Comm::world();
  const std::string dir = scratch_dir(world, "h5err");
  on_root(world, [&] {
    try {
      h5::File::open(dir + "/absent.h5", false, nullptr);
      FAIL() << "no exception";
    } catch (const h5::H5Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.call(), "H5Fopen");
      EXPECT_NE(what.find("rank 0"), std::string::npos) << what;
      EXPECT_NE(what.find("absent.h5"), std::string::npos) << what;
      EXPECT_NE(what.find("h5.cpp:"), std::string::npos) << what;
      EXPECT_NE(what.find("unable to open file"), std::string::npos) << what;
    }
    h5::File f = h5::File::create(dir + "/x.h5", nullptr);
    h5::Group root = f.root();
    try {
      root.open_dataset("nothing");
      FAIL() << "no exception";
    } catch (const h5::H5Error& e) {
      EXPECT_EQ(e.call(), "H5Dopen2");
      EXPECT_EQ(e.object(), "/nothing");
    }
  });
}

}  // namespace
}  // namespace fastudy
