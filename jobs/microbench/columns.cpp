// The microbench job's output schema (microbench_columns.hpp): the columns, cell access, CSV text and
// the byte codec of records.
#include "jobs/microbench/columns.hpp"

#include <iterator>
#include <stdexcept>

#include "base/number.hpp"
#include "kernels/fa2_launch.hpp"
#include "base/quote.hpp"

namespace fastudy::microbench_table {

namespace {

// ---- the output columns: one row each, in file order ---------------------------------------------
// A new column is one row here (and its value in MicrobenchRow).
const Column kColumns[] = {
    {"sweep", ColumnType::text, [](const std::string& sweep, const MicrobenchRow&) -> Cell { return sweep; }},
    {"algorithm", ColumnType::text, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.algorithm; }},
    {"pass", ColumnType::text,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::string(to_string(r.point.pass)); }},
    {"format", ColumnType::text,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::string(to_string(r.point.format)); }},
    {"policy", ColumnType::text, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.point.policy; }},
    {"rounding", ColumnType::text,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::string(to_string(r.rounding)); }},
    {"seq_len", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.seq_len}; }},
    {"head_dim", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.head_dim}; }},
    {"block_q", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.block_q}; }},
    {"block_kv", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.block_kv}; }},
    {"sram", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.sram}; }},
    {"tile_rule", ColumnType::text,
     [](const std::string&, const MicrobenchRow& r) -> Cell {
       return r.point.tile_rule.empty() ? std::string("blocks") : r.point.tile_rule;
     }},
    {"loop_order", ColumnType::text,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::string(to_string(r.point.loop_order)); }},
    {"launch", ColumnType::text,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::string(to_string(r.point.launch)); }},
    {"sm_count", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell {
       return std::int64_t{r.point.launch == Launch::pytorch ? r.point.sm_count : 0};
     }},
    // The forward's KV splits under launch = "pytorch" (the backward's O and lse come from that forward); 1
    // for the fixed tiles of launch = "blocks".
    {"kv_splits", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell {
       if (r.point.launch != Launch::pytorch) return std::int64_t{1};
       return std::int64_t{fa2_forward_launch(microbench_shape(r.point), r.point.sm_count).num_splits};
     }},
    {"causal", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.causal ? 1 : 0}; }},
    {"trial", ColumnType::integer,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::int64_t{r.point.trial}; }},
    {"distribution", ColumnType::text,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return std::string(to_string(r.point.distribution)); }},
    {"max_abs", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.max_abs; }},
    {"mean_abs", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.mean_abs; }},
    {"std_abs", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.std_abs; }},
    {"rel_l2", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.rel_l2; }},
    {"rmse", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.rmse; }},
    {"mean_signed", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.mean_signed; }},
    {"max_ulp", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.max_ulp; }},
    {"repeated_max_rows", ColumnType::real,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return r.repeated_max_rows; }},
    {"rescales_per_row", ColumnType::real,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return r.rescales_per_row; }},
    {"tiles_kv", ColumnType::integer, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.tiles_kv; }},
    {"check", ColumnType::text, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.check; }},
    {"vs_cpu", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.vs_cpu; }},
    {"check_bound", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.check_bound; }},
    {"vs_reading", ColumnType::text, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.vs_reading; }},
    {"bit_identical", ColumnType::real,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return r.bit_identical; }},
    {"max_ulp_vs", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.max_ulp_vs; }},
    // The "file" row's agreement per output tensor (NaN where a tensor is not compared).
    {"bit_identical_o", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.o.bit_identical; }},
    {"max_ulp_o", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.o.max_ulp; }},
    {"bit_identical_lse", ColumnType::real,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return r.lse.bit_identical; }},
    {"max_ulp_lse", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.lse.max_ulp; }},
    {"bit_identical_dq", ColumnType::real,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return r.dq.bit_identical; }},
    {"max_ulp_dq", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.dq.max_ulp; }},
    {"bit_identical_dk", ColumnType::real,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return r.dk.bit_identical; }},
    {"max_ulp_dk", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.dk.max_ulp; }},
    {"bit_identical_dv", ColumnType::real,
     [](const std::string&, const MicrobenchRow& r) -> Cell { return r.dv.bit_identical; }},
    {"max_ulp_dv", ColumnType::real, [](const std::string&, const MicrobenchRow& r) -> Cell { return r.dv.max_ulp; }},
};

}  // namespace

const std::vector<Column>& columns() {
  static const std::vector<Column> all(std::begin(kColumns), std::end(kColumns));
  return all;
}

std::size_t column(std::string_view name) {
  for (std::size_t c = 0; c < std::size(kColumns); ++c)
    if (name == kColumns[c].name) return c;
  throw std::logic_error("microbench: no column " + std::string(name));
}

Record record_of(const std::string& sweep, const MicrobenchRow& r) {
  Record rec;
  rec.reserve(std::size(kColumns));
  for (const auto& c : kColumns) rec.push_back(c.get(sweep, r));
  return rec;
}

std::string csv_text(const Cell& cell) {
  if (const auto* t = std::get_if<std::string>(&cell)) return *t;
  if (const auto* i = std::get_if<std::int64_t>(&cell)) return std::to_string(*i);
  return number_text(std::get<double>(cell));
}

std::string csv_line(const Record& rec) {
  std::string line;
  for (std::size_t c = 0; c < rec.size(); ++c) {
    const auto* text = std::get_if<std::string>(&rec[c]);
    line += (c ? "," : "") + (text ? csv_field(*text) : csv_text(rec[c]));
  }
  return line;
}

double real_at(const Record& rec, std::string_view name) { return std::get<double>(rec[column(name)]); }
const std::string& text_at(const Record& rec, std::string_view name) { return std::get<std::string>(rec[column(name)]); }

void put_record(ByteWriter& out, std::uint64_t index, const Record& rec) {
  out.put(index);
  for (std::size_t c = 0; c < std::size(kColumns); ++c) {
    if (kColumns[c].type == ColumnType::text) out.put_string(std::get<std::string>(rec[c]));
    else if (kColumns[c].type == ColumnType::integer) out.put(std::get<std::int64_t>(rec[c]));
    else out.put(std::get<double>(rec[c]));
  }
}

std::vector<std::pair<std::uint64_t, Record>> take_records(const std::string& bytes) {
  std::vector<std::pair<std::uint64_t, Record>> out;
  ByteReader in(bytes, "microbench: the records a rank sent");
  while (!in.done()) {
    const auto index = in.get<std::uint64_t>();
    Record rec;
    for (const auto& c : kColumns) {
      if (c.type == ColumnType::text) rec.emplace_back(in.get_string());
      else if (c.type == ColumnType::integer) rec.emplace_back(in.get<std::int64_t>());
      else rec.emplace_back(in.get<double>());
    }
    out.emplace_back(index, std::move(rec));
  }
  return out;
}

}  // namespace fastudy::microbench_table
