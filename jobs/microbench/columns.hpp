// The microbench job's output schema: one column per cell of a written row (kColumns in
// microbench_columns.cpp: name, type, getter), a row as a Record of cells, reading a cell by column
// name, a cell as CSV text, and the byte codec records travel in from the ranks to rank 0. The CSV,
// the HDF5 table and the printed tables (microbench_table.hpp) are all written from this schema, and
// the report reads the columns by these names (the HDF5 `columns` attribute lists them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "base/bytes.hpp"
#include "kernels/microbench.hpp"

namespace fastudy::microbench_table {

using Cell = std::variant<std::string, std::int64_t, double>;
using Record = std::vector<Cell>;  // one output row, a cell per column

// Text columns are written to HDF5 as integer codes with a `labels` attribute (one label per line).
enum class ColumnType { text, integer, real };

struct Column {
  const char* name;
  ColumnType type;
  Cell (*get)(const std::string& sweep, const MicrobenchRow& r);
};

// Every column, in file order.
const std::vector<Column>& columns();
// The position of a column (a name not in the schema is a programming error: std::logic_error).
std::size_t column(std::string_view name);

// The output row of `r` in sweep `sweep`.
Record record_of(const std::string& sweep, const MicrobenchRow& r);

// CSV text of a cell: reals with 17 significant digits (they read back exactly).
std::string csv_text(const Cell& cell);
// A record as one CSV line (no newline).
std::string csv_line(const Record& rec);
// The cell of a real or text column, by name.
double real_at(const Record& rec, std::string_view name);
const std::string& text_at(const Record& rec, std::string_view name);

// Records travel from the ranks to rank 0 as bytes (base/bytes.hpp): per record its point index, then
// per cell its value (text: length and bytes; integer and real: their 8 bytes), in schema order.
void put_record(ByteWriter& out, std::uint64_t index, const Record& rec);
// Every (index, record) of one rank's bytes, in the order put; Error on truncated bytes.
std::vector<std::pair<std::uint64_t, Record>> take_records(const std::string& bytes);

}  // namespace fastudy::microbench_table
