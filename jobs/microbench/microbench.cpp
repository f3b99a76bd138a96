// `fastudy microbench GRID.toml`: the numeric microbenchmark (the paper's Section IV). Expands every
// [[microbench.sweeps]] into points, deals them over the MPI ranks by cost (largest first), gathers the
// rows on rank 0 in point order (so the output does not depend on the number of ranks) and writes
// OUT/microbench.csv and OUT/microbench.h5 (microbench_table.hpp), both from one schema of columns
// (microbench_columns.hpp). Rank 0 prints the flash/baseline error ratio per format, reading (policy)
// and rounding, and against the number of KV tiles. Sweeps with save_outputs also put every point's
// inputs and outputs in OUT/microbench_outputs.h5 (microbench_saved.hpp), each rank writing its points.
// Real kernels (docs/microbench.md "Real kernels"): a sweep with devices = ["cpu", "cuda"] adds our CUDA kernels'
// rows to each point (checked against the CPU kernels), one with framework = [...] adds points of
// policy "native" with LibTorch's SDPA rows; the preflight (microbench_preflight.hpp) refuses them
// (exit 2) before any work where a rank sees no device, and rank 0 prints
// microbench_table::real_kernel_tables.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <thread>

#include "base/bytes.hpp"
#include "base/log.hpp"
#include "base/number.hpp"
#include "base/progress.hpp"
#include "jobs/collective.hpp"
#include "jobs/job.hpp"
#include "jobs/microbench/file.hpp"
#include "jobs/microbench/points.hpp"
#include "jobs/microbench/preflight.hpp"
#include "jobs/microbench/saved.hpp"
#include "jobs/preflight.hpp"
#include "src/train/microbench_sdpa.hpp"
#include "src/train/microbench_torch.hpp"
#include "jobs/microbench/table.hpp"
#include "kernels/fa2_launch.hpp"
#include "kernels/microbench.hpp"
#if FASTUDY_HAVE_CUDA_KERNELS
#include "kernels/cuda/microbench_cuda.hpp"
#endif
#include "src/io/checkpoint.hpp"
#include "src/runtime/deal.hpp"
#include "src/runtime/mpi.hpp"
#include "src/train/trainer.hpp"

namespace fs = std::filesystem;

namespace fastudy {

namespace {

using microbench_table::Record;


// The tiles of a sweep at head dim d: its `blocks`, or (when it lists SRAM sizes) each SRAM size
// under each tile rule, as {block_q, block_kv, sram, rule}.
struct Tiles {
  int block_q, block_kv, sram;
  std::string rule;
};
std::vector<Tiles> sweep_tiles(const MicrobenchSweep& sw, int d) {
  std::vector<Tiles> out;
  if (sw.launch == Launch::pytorch) return {{0, 0, 0, "pytorch"}};  // set point by point (launch_tiles)
  if (sw.sram.empty()) {
    for (const auto& [bq, bkv] : sw.blocks) out.push_back({bq, bkv, 0, ""});
    return out;
  }
  for (int m : sw.sram)
    for (const auto& rule : sw.tile_rules) {
      const auto [bq, bkv] = paper_tiles(m, d, rule);
      out.push_back({bq, bkv, m, rule});
    }
  return out;
}

// The variant a captured sweep reads its checkpoint from; UsageError when the grid has no such variant.
const Variant& captured_variant(const Study& st, const MicrobenchSweep& sw) {
  const Variant* v = st.find_variant(sw.captured_variant);
  if (v == nullptr) {
    std::string ids;
    for (const auto& x : st.variants) ids += (ids.empty() ? "" : ", ") + x.id;
    throw UsageError("[microbench] sweep '" + sw.name + "': captured_variant = \"" + sw.captured_variant +
                         "\" is not a variant of this study",
                     "use one of: " + ids);
  }
  if (sw.captured_layer >= st.model.layers) {
    throw UsageError("[microbench] sweep '" + sw.name + "': captured_layer = " + std::to_string(sw.captured_layer) +
                         " is not a layer of the model ([model] layers = " + std::to_string(st.model.layers) + ")",
                     "use a block index from 0 to " + std::to_string(st.model.layers - 1));
  }
  return *v;
}

// The step of the checkpoint a captured sweep reads: captured_step, or the variant's last step.
std::int64_t captured_step(const Study& st, const MicrobenchSweep& sw) {
  return sw.captured_step > 0 ? sw.captured_step : captured_variant(st, sw).train.steps;
}

// The checkpoint a captured sweep reads: the study's checkpoint of the variant at its captured step.
std::string captured_checkpoint(const Study& st, const std::string& out_dir, const MicrobenchSweep& sw) {
  return checkpoint_path(out_dir, captured_variant(st, sw).id, captured_step(st, sw));
}

// The checkpoint a captured sweep reads, whole and the variant's checkpoint of that step trained with
// its configuration (CheckpointIdentity). Throws CheckpointError.
TrainState read_captured(const Study& st, const MicrobenchSweep& sw, const std::string& path) {
  const Variant& v = captured_variant(st, sw);
  TrainState s = read_checkpoint(path);
  const CheckpointIdentity want{v.id, captured_step(st, sw), v.hash};
  if (auto problem = identity_problem(CheckpointInfo{s.step, s.data_cursor, s.attrs}, want))
    throw CheckpointError(path, "", *problem, "train the variant again (fastudy train GRID --out OUT --resume)");
  return s;
}

// Q, K, V of a captured sweep, read once per rank (cache keyed by checkpoint, layer and batch).
const MicrobenchInputs& captured_inputs(const Study& st, const std::string& out_dir, const MicrobenchSweep& sw,
                                        std::map<std::string, MicrobenchInputs>& cache) {
  const std::string path = captured_checkpoint(st, out_dir, sw);
  const std::string key = path + "|" + std::to_string(sw.captured_layer) + "|" + std::to_string(sw.captured_batch);
  auto it = cache.find(key);
  if (it == cache.end()) {
    const CapturedAttention cap = capture_attention_inputs(
        captured_variant(st, sw), read_captured(st, sw, path), sw.captured_layer, sw.captured_batch);
    log::info("microbench: captured Q, K, V of layer " + std::to_string(sw.captured_layer) + " on batch " +
              std::to_string(sw.captured_batch) + " from " + path);
    MicrobenchInputs in;
    in.q = cap.q;
    in.k = cap.k;
    in.v = cap.v;
    it = cache.emplace(key, std::move(in)).first;
  }
  return it->second;
}

// What a sweep's points range over besides its passes, formats, shapes, causal flags and trials: the
// readings of our kernels (policies, roundings, tiles at each head dim, loop orders), or the
// framework's single "native" one.
struct Readings {
  std::vector<std::string> policies;
  std::vector<std::optional<Rounding>> roundings;  // nullopt: the policy's own
  std::function<std::vector<Tiles>(int head_dim)> tiles;
  std::vector<LoopOrder> loop_orders;
};

// A point of a launch = "pytorch" sweep records the tiles PyTorch's launch picks for its pass and shape
// (forward: the split-KV kernel's 64 x block_n when it splits).
void set_launch_tiles(MicrobenchPoint& p) {
  const AttentionShape shape = microbench_shape(p);
  if (p.pass == Pass::forward) {
    const Fa2ForwardLaunch l = fa2_forward_launch(shape, p.sm_count);
    p.block_q = l.block_m, p.block_kv = l.block_n;
  } else {
    const Fa2BackwardLaunch l = fa2_backward_launch(shape, p.sm_count);
    p.block_q = l.block_m, p.block_kv = l.block_n;
  }
}

// Appends every point of sweep `sw` (read from `source`: a captured sweep's shape is the model's) under
// `readings`, in the order pass, format, policy, rounding, N, d, tiles, loop order, causal, trial; each
// takes the sweep's input settings (batch, heads, distribution, outliers, sink logit, seed).
void add_points(std::vector<SweepPoint>& pts, const MicrobenchSweep& sw, const MicrobenchSweep& source,
                const Readings& readings, bool cuda, const std::vector<std::string>& framework,
                const std::vector<std::string>& torch_cpu) {
  for (Pass pass : sw.passes)
    for (Format f : sw.formats)
      for (const auto& policy : readings.policies)
        for (const auto& rounding : readings.roundings)
          for (int n : sw.seq_lens)
            for (int d : sw.head_dims)
              for (const Tiles& tiles : readings.tiles(d))
                for (LoopOrder order : readings.loop_orders)
                  for (bool causal : sw.causal)
                    for (int trial = 0; trial < sw.trials; ++trial) {
                      MicrobenchPoint p;
                      p.pass = pass;
                      p.format = f;
                      p.policy = policy;
                      p.rounding = rounding;
                      p.seq_len = n;
                      p.head_dim = d;
                      p.block_q = std::min(tiles.block_q, n);  // the kernels clip too; record what ran
                      p.block_kv = std::min(tiles.block_kv, n);
                      p.sram = tiles.sram;
                      p.tile_rule = tiles.rule;
                      p.loop_order = order;
                      p.causal = causal;
                      p.trial = trial;
                      p.batch = sw.batch;
                      p.heads = sw.heads;
                      p.launch = sw.launch;
                      p.sm_count = sw.sm_count;
                      if (sw.launch == Launch::pytorch) set_launch_tiles(p);
                      p.distribution = sw.distribution;
                      p.outlier_fraction = sw.outlier_fraction;
                      p.outlier_scale = sw.outlier_scale;
                      p.sink_logit = sw.sink_logit;
                      p.repeated_keys = sw.repeated_keys;
                      p.seed = sw.seed;
                      // FlashAttention-2's loop runs at FA-2's loop order only.
                      std::vector<std::string> torch_rows;
                      for (const auto& a : torch_cpu)
                        if (find_real_code(a)->kind != AttentionKind::flash || order == LoopOrder::q_outer)
                          torch_rows.push_back(a);
                      pts.push_back({sw.name, p, &source, cuda, framework, torch_rows});
                    }
}

// Where a file sweep's input_file is named in messages.
std::string input_file_key(const Study& st, const MicrobenchSweep& sw) {
  return st.file + ": [microbench] sweep '" + sw.name + "': input_file";
}

}  // namespace

std::vector<SweepPoint> expand_points(const Study& st) {
  std::vector<SweepPoint> pts;
  for (const auto& sw0 : st.microbench.sweeps) {
    // A captured sweep has the shape of the model's attention on one batch of the variant; a file sweep
    // the shape of the file's tensors, one trial (every trial would read the same values).
    MicrobenchSweep given_shape;
    const bool given = sw0.distribution == InputDistribution::captured || sw0.distribution == InputDistribution::file;
    if (sw0.distribution == InputDistribution::captured) {
      given_shape = sw0;
      given_shape.seq_lens = {st.model.seq_len};
      given_shape.head_dims = {st.model.d_model / st.model.heads};
      given_shape.batch = captured_variant(st, sw0).train.batch;
      given_shape.heads = st.model.heads;
    } else if (sw0.distribution == InputDistribution::file) {
      const FileShape f = microbench_file_shape(sw0.input_file, input_file_key(st, sw0));
      const auto limit = static_cast<std::int64_t>(std::numeric_limits<int>::max());
      if (f.batch > limit || f.heads > limit || f.seq_len > limit || f.head_dim > limit)
        throw UsageError(input_file_key(st, sw0) + ": '" + sw0.input_file + "': q's shape does not fit the microbenchmark",
                         "use tensors of at most 2^31 - 1 along each dimension");
      given_shape = sw0;
      given_shape.seq_lens = {static_cast<int>(f.seq_len)};
      given_shape.head_dims = {static_cast<int>(f.head_dim)};
      given_shape.batch = static_cast<int>(f.batch);
      given_shape.heads = static_cast<int>(f.heads);
      given_shape.trials = 1;
      if (sw0.launch == Launch::pytorch && f.head_dim > kFa2MaxHeadDim)
        throw UsageError(input_file_key(st, sw0) + ": '" + sw0.input_file + "' has head dim " +
                             std::to_string(f.head_dim) + ", and launch = \"pytorch\" runs head dims up to " +
                             std::to_string(kFa2MaxHeadDim),
                         "set launch = \"blocks\" for this file");
    }
    const MicrobenchSweep& sw = given ? given_shape : sw0;
    // Our kernels: every policy, rounding, tile and loop order. The framework's kernels: one point per
    // input (pass, format, shape, causal, trial), policy "native" (the hardware's own arithmetic), no
    // tiles of ours (block sizes 0, tile rule "native").
    Readings ours;
    ours.policies = sw.policies;
    ours.roundings.assign(sw.roundings.begin(), sw.roundings.end());
    if (ours.roundings.empty()) ours.roundings.push_back(std::nullopt);  // each policy's own
    ours.tiles = [&sw](int d) { return sweep_tiles(sw, d); };
    ours.loop_orders = sw.loop_orders;
    // The framework's code: LibTorch's CPU algorithms beside our kernels on their points, the SDPA
    // backends (CUDA) on points of their own.
    std::vector<std::string> torch_cpu, sdpa;
    for (const auto& a : sw.framework) (find_real_code(a)->device == "cpu" ? torch_cpu : sdpa).push_back(a);
    add_points(pts, sw, sw0, ours, runs_our_cuda_kernels(sw), {}, torch_cpu);
    if (!sdpa.empty()) {
      Readings native;
      native.policies = {"native"};
      native.roundings = {std::nullopt};
      native.tiles = [](int) { return std::vector<Tiles>{{0, 0, 0, "native"}}; };
      native.loop_orders = {MicrobenchPoint{}.loop_order};
      const std::size_t first_native = pts.size();
      add_points(pts, sw, sw0, native, false, sdpa, {});
      for (std::size_t i = first_native; i < pts.size(); ++i) {
        const Tiles t = sweep_tiles(sw, pts[i].point.head_dim).front();
        pts[i].reading_block_q = std::min(t.block_q, pts[i].point.seq_len);
        pts[i].reading_block_kv = std::min(t.block_kv, pts[i].point.seq_len);
      }
    }
  }
  return pts;
}

namespace {

// Checked before anything is written: the checkpoint of every captured sweep exists (its variant and
// layer were checked by expand_points).
void check_captured_checkpoints(const Study& st, const std::string& out_dir) {
  for (const auto& sw : st.microbench.sweeps) {
    if (sw.distribution != InputDistribution::captured) continue;
    const std::string path = captured_checkpoint(st, out_dir, sw);
    if (!file_exists(path)) {
      throw UsageError("[microbench] sweep '" + sw.name + "': the checkpoint to capture Q, K, V from, " + path +
                           ", does not exist",
                       "train the variant first (fastudy train GRID), then run fastudy microbench GRID --resume; "
                       "or set captured_step to a step with a checkpoint");
    }
  }
}

// The input files of the file sweeps, read and checked on every rank before any work (collective): a
// refused file is a UsageError on every rank (the rank's own message, or that another rank refused it);
// a file whose outputs (o, lse, dq, dk, dv) are in a format the sweep's formats do not list is refused
// too, since no point could compare them. Keyed by path.
std::map<std::string, FileInputs> read_input_files(const Study& st, mpi::Comm& world) {
  std::map<std::string, FileInputs> files;
  std::optional<UsageError> refused;
  for (const auto& sw : st.microbench.sweeps) {
    if (sw.distribution != InputDistribution::file || refused) continue;
    const bool backward = std::find(sw.passes.begin(), sw.passes.end(), Pass::backward) != sw.passes.end();
    try {
      auto it = files.find(sw.input_file);
      if (it == files.end() || (backward && it->second.values.dout.empty()))
        it = files.insert_or_assign(sw.input_file, read_microbench_file(sw.input_file, backward, input_file_key(st, sw))).first;
      const FileInputs& in = it->second;
      if (in.output_format &&
          std::find(sw.formats.begin(), sw.formats.end(), *in.output_format) == sw.formats.end())
        throw UsageError(input_file_key(st, sw) + ": '" + sw.input_file + "' holds outputs in " +
                             std::string(to_string(*in.output_format)) + ", and the sweep's formats do not list " +
                             std::string(to_string(*in.output_format)) + ", so no point could compare them",
                         "add \"" + std::string(to_string(*in.output_format)) + "\" to formats");
    } catch (const UsageError& e) {
      refused = e;
    }
  }
  if (world.allreduce_max(std::int64_t{refused ? 1 : 0}) != 0) {
    if (refused) throw *refused;
    throw UsageError(st.file + ": [microbench] another rank refused an input_file", "see that rank's message");
  }
  return files;
}

// The tiles of every point of our CUDA kernels, in point order (for the preflight).
std::vector<CudaPointTiles> cuda_point_tiles(const std::vector<SweepPoint>& points) {
  std::vector<CudaPointTiles> tiles;
  for (const auto& sp : points)
    if (sp.cuda) tiles.push_back({sp.sweep, sp.point.block_q, sp.point.block_kv, sp.point.head_dim});
  return tiles;
}

// Whether a framework backend's rows are compared with the reading that claims to model it (a reading
// this build has): then its point saves that reading's output too, as "<backend>_reading".
bool compared_with_reading(const std::string& backend) {
  const RealCode& code = *find_real_code(backend);
  return !code.reading.empty() && is_policy_preset(code.reading);
}

// The algorithms whose outputs a point saves (OUT/microbench_outputs.h5, save_outputs): the fp64 golden
// value, then what point_rows computes, in its order; a real code's row compared with a reading's output
// (its column vs_reading) also saves that output, as "<algorithm>_reading".
std::vector<std::string> saved_algorithms(const SweepPoint& sp) {
  std::vector<std::string> names{"golden"};
  if (!sp.framework.empty()) {
    for (const auto& backend : sp.framework) {
      names.push_back(backend);
      if (compared_with_reading(backend)) names.push_back(backend + "_reading");
    }
    return names;
  }
  names.insert(names.end(), {"flash", "baseline"});
  for (const auto& a : sp.torch_cpu) names.insert(names.end(), {a, a + "_reading"});
  if (sp.cuda) names.insert(names.end(), {"cuda_flash", "cuda_baseline"});
  return names;
}

// A point's inputs and fp64 golden value, as it saves them.
void keep_inputs(const MicrobenchRun& run, SavedValues& saved) {
  saved.q = run.q;
  saved.k = run.k;
  saved.v = run.v;
  if (run.point.pass == Pass::backward) saved.dout = run.dout;
  saved.outputs["golden"] = run.golden;
}

// The rows of one point: our CPU kernels' (and, with sp.cuda, our CUDA kernels'), or for a framework
// point each SDPA backend's on CUDA device `device`. `saved`, when given, receives the point's inputs
// and the outputs of saved_algorithms(sp) by name.
std::vector<MicrobenchRow> point_rows(const Study& st, const std::string& out_dir, const SweepPoint& sp, int threads,
                                      int device, std::map<std::string, MicrobenchInputs>& capture_cache,
                                      const std::map<std::string, FileInputs>& files, SavedValues* saved) {
  std::optional<ReadingPolicies> policy;
  if (st.attention.custom_policies.count(sp.point.policy))
    policy = resolve_reading(st.attention, sp.point.policy, sp.point.format);
  const MicrobenchInputs* captured = nullptr;
  const FileInputs* file = nullptr;
  if (sp.point.distribution == InputDistribution::captured) captured = &captured_inputs(st, out_dir, *sp.source, capture_cache);
  if (sp.point.distribution == InputDistribution::file) {
    file = &files.at(sp.source->input_file);
    captured = &file->values;
  }
  std::vector<MicrobenchRow> rows;
  if (!sp.framework.empty()) {
    // The inputs rounded to the format (the pure reading's q, k, v and grad formats).
    const MicrobenchRun run = prepare_microbench_point(sp.point, make_reading("pure", sp.point.format), threads, captured);
    if (saved != nullptr) keep_inputs(run, *saved);
    for (const auto& backend : sp.framework) {
      std::vector<double> values;
      rows.push_back(microbench_sdpa_row(run, backend, device, &values));
      // Beside the reading that claims to model the backend, where this build has that reading.
      if (compared_with_reading(backend)) {
        const RealCode& code = *find_real_code(backend);
        std::vector<double> reading = reading_values(run, code.reading, code.kind, sp.reading_block_q,
                                                     sp.reading_block_kv, LoopOrder::q_outer);
        set_agreement(rows.back(), values, reading, std::string(code.reading) + " " + std::string(to_string(code.kind)));
        if (saved != nullptr) saved->outputs[backend + "_reading"] = std::move(reading);
      }
      if (saved != nullptr) saved->outputs[backend] = std::move(values);
    }
    return rows;
  }
  MicrobenchRun run;
  rows = run_microbench_point(sp.point, policy, threads, captured, &run);
  if (file != nullptr)
    if (std::optional<MicrobenchRow> row = microbench_file_row(run, *file)) rows.push_back(std::move(*row));
  if (saved != nullptr) {
    keep_inputs(run, *saved);
    saved->outputs["flash"] = run.flash.values;
    saved->outputs["baseline"] = run.baseline.values;
  }
  for (const auto& a : sp.torch_cpu) {
    std::vector<double> values, reading;
    rows.push_back(microbench_torch_row(run, a, &values, &reading));
    if (saved != nullptr) {
      saved->outputs[a] = std::move(values);
      saved->outputs[a + "_reading"] = std::move(reading);
    }
  }
  if (sp.cuda) {
#if FASTUDY_HAVE_CUDA_KERNELS
    for (auto& r : cuda::microbench_cuda_rows(run, saved != nullptr ? &saved->outputs : nullptr)) rows.push_back(std::move(r));
#else
    throw std::logic_error("microbench: a CUDA point in a build without CUDA kernels");
#endif
  }
  return rows;
}

// Rank 0: the records every rank sent (microbench_table::put_record), in point order.
std::vector<Record> records_in_point_order(const std::vector<std::string>& parts) {
  std::vector<std::pair<std::uint64_t, Record>> records;
  for (const auto& part : parts)
    for (auto& r : microbench_table::take_records(part)) records.push_back(std::move(r));
  std::stable_sort(records.begin(), records.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Record> rows;
  for (auto& [index, rec] : records) rows.push_back(std::move(rec));
  return rows;
}

}  // namespace

int job_microbench(JobContext& ctx) {
  const Study& st = *ctx.study;
  mpi::Comm& world = *ctx.world;
  const std::string csv_path = (fs::path(ctx.out_dir) / "microbench.csv").string();
  const std::string h5_path = (fs::path(ctx.out_dir) / "microbench.h5").string();

  const std::vector<SweepPoint> points = expand_points(st);
  check_captured_checkpoints(st, ctx.out_dir);
  const std::map<std::string, FileInputs> files = read_input_files(st, world);
  const int device = microbench_cuda_preflight(st, cuda_point_tiles(points), world);

  // save_outputs: the points of the sweeps that ask, numbered in point order (microbench_saved.hpp).
  const std::string saved_path = (fs::path(ctx.out_dir) / kSavedOutputsName).string();
  std::vector<SavedPoint> saved_points;
  std::vector<std::ptrdiff_t> saved_index(points.size(), -1);
  for (std::size_t i = 0; i < points.size(); ++i) {
    const SweepPoint& sp = points[i];
    if (sp.source == nullptr || !sp.source->save_outputs) continue;
    saved_index[i] = static_cast<std::ptrdiff_t>(saved_points.size());
    saved_points.push_back({sp.sweep, sp.point, saved_algorithms(sp)});
  }

  bool skip = false;
  on_root(world, [&] {
    if (!saved_points.empty() && !(ctx.opts.resume && !ctx.opts.force && file_exists(saved_path)))
      check_output_space(ctx.out_dir, static_cast<double>(saved_outputs_bytes(saved_points)),
                         std::string(kSavedOutputsName) + " (save_outputs: every saved point's inputs and outputs)");
    prepare_output(ctx);
    skip = ctx.opts.resume && !ctx.opts.force && file_exists(csv_path) && file_exists(h5_path) &&
           (saved_points.empty() || file_exists(saved_path)) &&
           read_text_file(csv_path).find("# config_hash: " + st.hash) != std::string::npos;
  });
  std::int64_t skip_flag = skip ? 1 : 0;
  world.bcast(skip_flag);
  if (skip_flag) {
    log::info("microbench: " + csv_path + " is complete for this grid; skipped (`fastudy microbench GRID --out OUT "
              "--force` computes it again, replacing only microbench.csv and microbench.h5, and " +
              std::string(kSavedOutputsName) + " where a sweep has save_outputs)");
    return kExitOk;
  }

  const int threads = world.size() == 1 ? std::max(1u, std::thread::hardware_concurrency()) : 1;
  log::info("microbench: " + std::to_string(points.size()) + " points over " + std::to_string(world.size()) +
            " rank(s)");

  // Points are dealt by cost (microbench_cost; deal_largest_first): every rank computes the same deal.
  // Each point is computed whole by one rank and rank 0 writes the rows in point order, so the output
  // does not depend on the number of ranks. Each rank sends its records (put_record) to rank 0.
  std::vector<double> costs;
  for (const auto& sp : points) costs.push_back(microbench_cost(sp.point));
  const std::vector<int> owner = deal_largest_first(costs, world.size());
  std::size_t mine_total = 0;
  double mine_cost = 0, done_cost = 0;
  for (std::size_t i = 0; i < owner.size(); ++i)
    if (owner[i] == world.rank()) ++mine_total, mine_cost += costs[i];
  std::map<std::string, MicrobenchInputs> capture_cache;
  // Collective: created by every rank before any point runs; each rank writes the points it computes.
  std::optional<SavedOutputs> saved;
  if (!saved_points.empty()) saved.emplace(saved_path, saved_points, ctx.prov, world);
  ByteWriter mine;
  std::size_t done = 0;
  // Rank 0's share on the console (the deal gives every rank about the same cost): points done, the
  // speed, and the time left from the cost still to do at the cost per second measured so far.
  ProgressLine progress;
  const auto busy_start = std::chrono::steady_clock::now();
  auto busy_s = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - busy_start).count(); };
  for (std::size_t i = 0; i < points.size(); ++i) {
    if (owner[i] != world.rank()) continue;
    if (stop_signal_received()) break;  // checked again collectively below
    const SweepPoint& sp = points[i];
    SavedValues values;
    const bool save = saved_index[i] >= 0;
    for (const auto& row : point_rows(st, ctx.out_dir, sp, threads, device, capture_cache, files, save ? &values : nullptr))
      microbench_table::put_record(mine, i, microbench_table::record_of(sp.sweep, row));
    if (save) saved->write(static_cast<std::size_t>(saved_index[i]), values);
    ++done;
    done_cost += costs[i];
    const double t = busy_s();
    progress.update("microbench: " + std::string(world.size() > 1 ? "rank 0 " : "") + std::to_string(done) + "/" +
                    std::to_string(mine_total) + " points, " + rate_text(static_cast<double>(done) / t) +
                    " points/s, " + eta_text(t * (mine_cost - done_cost) / done_cost));
  }
  progress.finish();
  const double busy = busy_s();
  double busy_range[2] = {busy, -busy};
  world.allreduce_max(busy_range, 2);
  const double busy_max = busy_range[0], busy_min = -busy_range[1];
  if (world.size() > 1)
    log::info("microbench: ranks busy " + number_text(busy_min, 3) + " s to " + number_text(busy_max, 3) + " s");
  const bool stopped = world.allreduce_max(static_cast<std::int64_t>(stop_signal_received())) != 0;
  if (saved) saved->finish(!stopped);  // collective; a stopped run removes its unfinished file
  if (stopped) {
    log::warn("microbench: stopped by a signal; nothing written (it reruns with --resume)");
    return kExitFailure;
  }
  const std::vector<std::string> parts = world.gather(mine.bytes());
  std::int64_t failed_checks = 0;

  on_root(world, [&] {
    const std::vector<Record> rows = records_in_point_order(parts);
    bool torch_rows = false;
    for (const auto& r : rows) {
      const RealCode* code = find_real_code(microbench_table::text_at(r, "algorithm"));
      torch_rows = torch_rows || (code != nullptr && code->device == "cpu");
    }
    const std::vector<std::string> notes = microbench_table::code_notes(rows, torch_rows ? torch_cpu_machine() : "");
    microbench_table::write_h5(h5_path, rows, ctx.prov, notes);
    microbench_table::write_csv(csv_path, rows, ctx.prov, notes);
    log::info(microbench_table::summary_tables(rows));
    std::size_t failed = 0;
    const std::string tables = microbench_table::real_kernel_tables(rows, failed);
    if (!tables.empty()) log::info(tables);
    failed_checks = static_cast<std::int64_t>(failed);
    log::info("microbench: wrote " + csv_path + " and " + h5_path + " (" + std::to_string(rows.size()) + " rows)");
  });
  world.bcast(failed_checks);
  if (failed_checks != 0) {
    log::error("microbench: " + std::to_string(failed_checks) + " CUDA row(s) failed their check against our CPU "
               "kernels (column check: DIFFERS or EXCEEDS BOUND in " + csv_path + ")");
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace fastudy
