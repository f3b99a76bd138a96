// `fastudy bisect OUT --variant A --against B --step S`: where two variants first part. One training
// step of each (forward and backward of the global batch at S's data cursor, no update) from the same
// weights, A's at step S (its checkpoint there; else its latest checkpoint before S, or the initial
// weights, trained on to S: the same bits as its own run), every op's output recorded (per layer
// LayerNorms, Q, K, V, attention output, projections, MLP; then the final LayerNorm, logits, loss, and
// every parameter's gradient) and compared: max |a - b| in roundings of the op's largest output
// (u of the coarser precision of the two), against kBisectBoundUlps (src/train/explain.hpp, derived
// there). The first op beyond the bound, every op before it agreeing within it, is where the two
// runs part.
//
// Output: a per-layer table in the terminal and OUT/bisect/<A>--<B>-step<S>.csv (op, layer, numel,
// max_abs, ref_max, ulps, bound_ulps, identical, beyond, first).
#include <cmath>
#include <filesystem>
#include <sstream>

#include <boost/program_options.hpp>

#include "base/checksum.hpp"
#include "base/log.hpp"
#include "base/manifest.hpp"
#include "base/number.hpp"
#include "jobs/explain_common.hpp"
#include "jobs/job.hpp"
#include "src/train/explain.hpp"

namespace fs = std::filesystem;
namespace po = boost::program_options;

namespace fastudy {
namespace {

// The layer an op belongs to: "blocks.3.attn.out" and "grad blocks.3.mlp.fc.weight" are layer 3; the
// others (embedding, final LayerNorm, logits, loss, their gradients) "-".
std::string layer_of(const std::string& op) {
  const std::size_t at = op.find("blocks.");
  if (at == std::string::npos) return "-";
  const std::size_t begin = at + 7, end = op.find('.', begin);
  return op.substr(begin, end - begin);
}

}  // namespace

void bisect_options(po::options_description& d, CliOptions& o) {
  d.add_options()("variant", po::value<std::vector<std::string>>(&o.bisect.variants), "variant A: its checkpoint gives the weights")(
      "against", po::value<std::string>(&o.bisect.against), "variant B, run from A's weights on the same batch")(
      "step", po::value<std::int64_t>(&o.bisect.at_step), "A's weights after this step (its checkpoint there, or trained on from the one before; 0: the initial weights); the batch is the next step's");
}

int job_bisect(JobContext& ctx) {
  const Study& st = *ctx.study;
  const std::string out = ctx.out_dir;
  if (ctx.opts.bisect.variants.size() > 1) throw UsageError("--variant names one variant (A)", "pass --variant once");
  const Variant& a = named_variant(st, "--variant", ctx.opts.bisect.variants.empty() ? "" : ctx.opts.bisect.variants[0]);
  const Variant& b = named_variant(st, "--against", ctx.opts.bisect.against);
  if (a.model.layers != b.model.layers || a.model.d_model != b.model.d_model)
    throw UsageError("--against " + b.id + " has another model than " + a.id, "bisect compares variants of one model");
  const TrainState state = state_at(out, a, ctx.opts.bisect.at_step, "--step", /*on_from_earlier=*/true);
  const std::int64_t step = ctx.opts.bisect.at_step;

  const std::string rel = "bisect/" + a.id + "--" + b.id + "-step" + std::to_string(step) + ".csv";
  manifest::add(out, {{manifest::Kind::file, "bisect", rel}});
  fs::create_directories(fs::path(out) / "bisect");

  log::info("bisect: " + a.id + " against " + b.id + ", one step from " + a.id + "'s weights at step " + std::to_string(step) +
            " on batch " + std::to_string(state.data_cursor));
  const BisectResult r = bisect_step(a, b, state);

  std::ostringstream csv, table;
  csv << ctx.prov.header();
  csv << "op,layer,numel,max_abs,ref_max,ulps,bound_ulps,identical,beyond,first\n";
  table << "  layer  op                              max |a-b|      ulps (" << to_string(r.format) << ")   \n";
  for (std::size_t i = 0; i < r.ops.size(); ++i) {
    const OpComparison& c = r.ops[i];
    const bool first = static_cast<int>(i) == r.first_beyond;
    csv << c.op << ',' << layer_of(c.op) << ',' << c.numel << ',' << number_text(c.max_abs, 9) << ',' << number_text(c.ref_max, 9)
        << ',' << number_text(c.ulps, 9) << ',' << number_text(r.bound_ulps, 9) << ',' << c.identical << ',' << c.beyond << ','
        << first << '\n';
    char line[200];
    std::snprintf(line, sizeof line, "  %-5s  %-30s  %-13s  %-12s  %s\n", layer_of(c.op).c_str(), c.op.c_str(),
                  number_text(c.max_abs, 3).c_str(), c.identical ? "identical" : number_text(c.ulps, 3).c_str(),
                  first ? "<- first beyond the bound" : c.beyond ? "beyond" : "");
    table << line;
  }
  const std::string path = (fs::path(out) / rel).string();
  atomic_write_sealed(path, csv.str());
  log::info(table.str());
  std::ostringstream verdict;
  verdict << "bisect: bound " << number_text(r.bound_ulps, 3) << " roundings of " << to_string(r.format) << "; ";
  if (r.first_beyond >= 0) {
    const OpComparison& c = r.ops[static_cast<std::size_t>(r.first_beyond)];
    verdict << "the first op beyond it is " << c.op << " (" << number_text(c.ulps, 3)
            << " roundings of its largest output), every op before it agrees within the bound";
  } else if (r.first_differs >= 0) {
    verdict << "every op agrees within it; the first whose bits differ is " << r.ops[static_cast<std::size_t>(r.first_differs)].op;
  } else {
    verdict << "the two runs are bit-identical";
  }
  log::info(verdict.str());
  log::info("bisect: wrote " + path);
  return kExitOk;
}

}  // namespace fastudy
