// The reduce of an imported study ([import]): the check of every imported file before any work
// (collective: a share of the files per rank), the plan it gives, and the provenance of the files
// (OUT/imported.csv: path, size and CRC-32 of every file read; a later reduce names the files that
// changed since). The files themselves are found and read by src/io/import_runs.hpp.
#pragma once

#include <string>
#include <vector>

#include "jobs/reduce_output.hpp"
#include "src/io/import_runs.hpp"

namespace fastudy {

namespace mpi {
class Comm;
}

struct ImportCheck {
  ReducePlan plan;
  std::vector<io::ImportedFileRecord> records;  // every file read, in plan order (rank 0)
  std::uint64_t data_bytes = 0;                 // the stored bytes of the compared tensors, all files
};

// Locates the files, checks every one of them (rank r the files r, r + R, ...) and that the runs
// agree, and makes the plan, the same on every rank. Bad input is a UsageError on rank 0 (SilentExit
// elsewhere), before any distance is computed. world may be null (one process: `fastudy plan`).
ImportCheck check_imports(const Study& st, mpi::Comm* world);

// Whether the study imports torch.save files (.pt, .pth, .bin), which only fastudy-main reads (through
// LibTorch); every other reduce runs in fastudy-lite (jobs/launcher.cpp).
bool imports_torch_files(const Study& st);

// OUT/imported.csv, sealed: one row per file (path, bytes, crc32; the path escaped onto one line,
// base/quote.hpp escaped(), and quoted). Before it is replaced, the files that differ from the previous
// one's rows are named in warnings; a previous one that does not match its checksum or holds a
// malformed row is named in a warning and not compared.
void write_imported_csv(const std::string& out, const std::vector<io::ImportedFileRecord>& records, const Provenance& prov);

}  // namespace fastudy
