// The only file that calls HDF5. Each H5* function appears once; check() turns a negative return
// into an H5Error carrying the call, file, object, rank, file:line and the innermost HDF5 messages.
#include "src/io/h5.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "base/quote.hpp"

namespace fastudy::h5 {
namespace {

// ---- errors ---------------------------------------------------------------------------------------

// HDF5 prints its error stack to stderr by default; we collect the messages into the exception.
void silence_automatic_printing() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }
void clear_errors() { H5Eclear2(H5E_DEFAULT); }

herr_t collect_error(unsigned n, const H5E_error2_t* e, void* out) {
  auto* text = static_cast<std::string*>(out);
  if (n >= 3) return 0;  // the innermost three entries say what went wrong
  char minor[256] = {0};
  H5Eget_msg(e->min_num, nullptr, minor, sizeof minor);
  if (!text->empty()) text->append("; ");
  text->append(e->desc ? e->desc : "");
  if (minor[0] != '\0') text->append(" (").append(minor).append(")");
  return 0;
}

std::string take_error_stack() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &text);
  clear_errors();
  // On one line: a message may hold a line break (the sec2 driver's write error holds ctime()'s).
  return text.empty() ? "no HDF5 error message" : one_line(text);
}

// `system`: the call writes to the file (a write, a create, a close that flushes), where the system's
// error behind a failure (errno: "No space left on device", "File too large") is what a user needs and
// HDF5's own messages may lack (the MPI-IO driver reports only that a write failed). errno is cleared
// before each call, so it names what happened in it.
template <class T>
T check(T result, const char* call, const Where& w, const char* src_file, int src_line, bool system = false) {
  if (result < 0) {
    const int err = errno;
    std::string details = take_error_stack();
    if (system && err != 0 && details.find(std::strerror(err)) == std::string::npos)
      details += " (system error: " + std::string(std::strerror(err)) + ")";
    throw H5Error(call, w.file, w.object, details, src_file, src_line);
  }
  return result;
}
#define FASTUDY_H5(where, call, ...) check(call(__VA_ARGS__), #call, where, __FILE__, __LINE__)
#define FASTUDY_H5_WRITE(where, call, ...) (errno = 0, check(call(__VA_ARGS__), #call, where, __FILE__, __LINE__, true))

// ---- closers: the single place each H5*close is called -----------------------------------------

herr_t close_plist(hid_t id) { return H5Pclose(id); }
herr_t close_space(hid_t id) { return H5Sclose(id); }
herr_t close_type(hid_t id) { return H5Tclose(id); }
herr_t close_attr(hid_t id) { return H5Aclose(id); }
herr_t close_group(hid_t id) { return H5Gclose(id); }
herr_t close_dataset(hid_t id) { return H5Dclose(id); }
std::atomic<int> g_failed_closes{0};
herr_t close_file(hid_t id) {
  const herr_t rc = H5Fclose(id);
  if (rc < 0) ++g_failed_closes;
  return rc;
}

// ---- access property lists: external links are never traversed ----------------------------------

herr_t refuse_external_link(const char*, const char*, const char*, const char*, unsigned*, hid_t, void*) { return -1; }

// One access list of class `cls` (group, dataset or link access, each a link access list) with the
// refusing callback, made once per process. Never closed: HDF5 releases it when the library shuts down.
hid_t no_external_links(hid_t cls) {
  const Where w{"", "link access property list"};
  const hid_t plist = FASTUDY_H5(w, H5Pcreate, cls);
  FASTUDY_H5(w, H5Pset_elink_cb, plist, refuse_external_link, nullptr);
  return plist;
}
hid_t group_access() {
  static const hid_t plist = no_external_links(H5P_GROUP_ACCESS);
  return plist;
}
hid_t dataset_access() {
  static const hid_t plist = no_external_links(H5P_DATASET_ACCESS);
  return plist;
}
hid_t link_access() {
  static const hid_t plist = no_external_links(H5P_LINK_ACCESS);
  return plist;
}

Handle open_group_handle(hid_t loc, const std::string& name, const Where& w) {
  return Handle(FASTUDY_H5(w, H5Gopen2, loc, name.c_str(), group_access()), close_group);
}

Handle plist(hid_t cls, const Where& w) { return Handle(FASTUDY_H5(w, H5Pcreate, cls), close_plist); }

// ---- types and spaces -----------------------------------------------------------------------------

hid_t file_type(DType t) {
  switch (t) {
    case DType::f32: return H5T_IEEE_F32LE;
    case DType::f64: return H5T_IEEE_F64LE;
    case DType::i64: return H5T_STD_I64LE;
    case DType::u8: return H5T_STD_U8LE;
  }
  return H5T_STD_U8LE;
}

hid_t memory_type(DType t) {
  switch (t) {
    case DType::f32: return H5T_NATIVE_FLOAT;
    case DType::f64: return H5T_NATIVE_DOUBLE;
    case DType::i64: return H5T_NATIVE_INT64;
    case DType::u8: return H5T_NATIVE_UINT8;
  }
  return H5T_NATIVE_UINT8;
}

Handle utf8_string_type(const Where& w) {
  Handle t(FASTUDY_H5(w, H5Tcopy, H5T_C_S1), close_type);
  FASTUDY_H5(w, H5Tset_size, t.id(), H5T_VARIABLE);
  FASTUDY_H5(w, H5Tset_cset, t.id(), H5T_CSET_UTF8);
  return t;
}

Handle simple_space(const std::vector<hsize_t>& dims, const Where& w) {
  return Handle(FASTUDY_H5(w, H5Screate_simple, static_cast<int>(dims.size()), dims.data(), nullptr),
                close_space);
}

Handle scalar_space(const Where& w) { return Handle(FASTUDY_H5(w, H5Screate, H5S_SCALAR), close_space); }

Handle space_of_dataset(hid_t d, const Where& w) { return Handle(FASTUDY_H5(w, H5Dget_space, d), close_space); }

std::vector<hsize_t> dims_of(hid_t space, const Where& w) {
  int rank = FASTUDY_H5(w, H5Sget_simple_extent_ndims, space);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank > 0) FASTUDY_H5(w, H5Sget_simple_extent_dims, space, dims.data(), nullptr);
  return dims;
}

// ---- attributes -----------------------------------------------------------------------------------

H5T_class_t type_class(hid_t type, const Where& w) { return FASTUDY_H5(w, H5Tget_class, type); }
std::size_t type_size(hid_t type, const Where& w) {
  const std::size_t n = H5Tget_size(type);  // 0 on failure (unsigned: check() does not apply)
  if (n == 0) throw H5Error("H5Tget_size", w.file, w.object, take_error_stack(), __FILE__, __LINE__);
  return n;
}
bool is_string_type(hid_t type, const Where& w) { return type_class(type, w) == H5T_STRING; }
bool attr_exists(hid_t obj, const std::string& name, const Where& w) {
  return FASTUDY_H5(w, H5Aexists, obj, name.c_str()) > 0;
}

Handle create_attr(hid_t obj, const std::string& name, hid_t type, const Where& w) {
  if (attr_exists(obj, name, w)) {
    throw H5Error("H5Acreate2", w.file, w.object, "attribute '" + name + "' exists already", __FILE__, __LINE__);
  }
  Handle space = scalar_space(w);
  return Handle(FASTUDY_H5_WRITE(w, H5Acreate2, obj, name.c_str(), type, space.id(), H5P_DEFAULT, H5P_DEFAULT),
                close_attr);
}

Handle open_attr(hid_t obj, const std::string& name, const Where& w) {
  return Handle(FASTUDY_H5(w, H5Aopen, obj, name.c_str(), H5P_DEFAULT), close_attr);
}

void write_attr(hid_t attr, hid_t mem_type, const void* buf, const Where& w) {
  FASTUDY_H5_WRITE(w, H5Awrite, attr, mem_type, buf);
}

void read_attr(hid_t attr, hid_t mem_type, void* buf, const Where& w) { FASTUDY_H5(w, H5Aread, attr, mem_type, buf); }

Handle type_of_attr(hid_t attr, const Where& w) { return Handle(FASTUDY_H5(w, H5Aget_type, attr), close_type); }


struct AttrNames {
  std::vector<std::string> names;
};

herr_t collect_attr_name(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<AttrNames*>(out)->names.emplace_back(name);
  return 0;
}

// ---- links ----------------------------------------------------------------------------------------

herr_t collect_link_name(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->emplace_back(name);
  return 0;
}

}  // namespace

H5Error::H5Error(std::string call, std::string file, std::string object, const std::string& details,
                 const char* src_file, int src_line)
    : Error(call + " failed on rank " + std::to_string(mpi::world_rank()) + " (" + src_file + ":" +
            std::to_string(src_line) + ")" + (object.empty() ? "" : " for '" + object + "'") + " in '" + file +
            "': " + details),
      call_(std::move(call)),
      file_(std::move(file)),
      object_(std::move(object)),
      details_(details) {}

// ---- Handle ---------------------------------------------------------------------------------------

Handle::Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), closer_(std::exchange(o.closer_, nullptr)) {}

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = std::exchange(o.id_, -1);
    closer_ = std::exchange(o.closer_, nullptr);
  }
  return *this;
}

hid_t Handle::release() noexcept {
  closer_ = nullptr;
  return std::exchange(id_, -1);
}

void Handle::reset() noexcept {
  // An object a strong file close closed already is no longer valid: nothing is left to close.
  if (id_ >= 0 && closer_ != nullptr && H5Iis_valid(id_) > 0) {
    if (closer_(id_) < 0) ++g_failed_closes;  // left open, broken (failed_closes)
  }
  if (id_ >= 0) clear_errors();
  id_ = -1;
  closer_ = nullptr;
}

// ---- attributes -----------------------------------------------------------------------------------

void Attributed::set_attr(const std::string& name, const std::string& value) {
  Handle type = utf8_string_type(where_);
  Handle attr = create_attr(id(), name, type.id(), where_);
  const char* p = value.c_str();
  write_attr(attr.id(), type.id(), &p, where_);
}

void Attributed::set_attr(const std::string& name, std::int64_t value) {
  Handle attr = create_attr(id(), name, H5T_STD_I64LE, where_);
  write_attr(attr.id(), H5T_NATIVE_INT64, &value, where_);
}

void Attributed::set_attr(const std::string& name, double value) {
  Handle attr = create_attr(id(), name, H5T_IEEE_F64LE, where_);
  write_attr(attr.id(), H5T_NATIVE_DOUBLE, &value, where_);
}

bool Attributed::has_attr(const std::string& name) const { return attr_exists(id(), name, where_); }

std::string Attributed::attr_string(const std::string& name) const {
  Handle attr = open_attr(id(), name, where_);
  Handle stored = type_of_attr(attr.id(), where_);
  if (!is_string_type(stored.id(), where_)) {
    throw H5Error("H5Aread", where_.file, where_.object, "attribute '" + name + "' is not a string", __FILE__,
                  __LINE__);
  }
  if (FASTUDY_H5(where_, H5Tis_variable_str, stored.id()) > 0) {
    Handle type = utf8_string_type(where_);
    char* p = nullptr;
    read_attr(attr.id(), type.id(), &p, where_);
    std::string out = p ? p : "";
    FASTUDY_H5(where_, H5free_memory, p);
    return out;
  }
  std::size_t n = type_size(stored.id(), where_);
  std::string out(n, '\0');
  read_attr(attr.id(), stored.id(), out.data(), where_);
  return out.substr(0, out.find('\0'));
}

std::int64_t Attributed::attr_int64(const std::string& name) const {
  Handle attr = open_attr(id(), name, where_);
  std::int64_t v = 0;
  read_attr(attr.id(), H5T_NATIVE_INT64, &v, where_);
  return v;
}

double Attributed::attr_double(const std::string& name) const {
  Handle attr = open_attr(id(), name, where_);
  double v = 0;
  read_attr(attr.id(), H5T_NATIVE_DOUBLE, &v, where_);
  return v;
}

std::vector<std::string> Attributed::string_attr_names() const {
  AttrNames all;
  FASTUDY_H5(where_, H5Aiterate2, id(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_attr_name, &all);
  std::vector<std::string> out;
  for (const auto& n : all.names) {
    Handle attr = open_attr(id(), n, where_);
    Handle type = type_of_attr(attr.id(), where_);
    if (is_string_type(type.id(), where_)) out.push_back(n);
  }
  return out;
}

// ---- transfers ------------------------------------------------------------------------------------

Transfer::Transfer(const File& file, bool collective) : collective_(file.parallel() && collective) {
  Where w{file.path(), ""};
  plist_ = plist(H5P_DATASET_XFER, w);
  if (file.parallel()) {
    FASTUDY_H5(w, H5Pset_dxpl_mpio, plist_.id(), collective_ ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT);
  }
}

std::string Transfer::io_mode() const {
  if (!collective_) return "none";
  H5D_mpio_actual_io_mode_t mode = H5D_MPIO_NO_COLLECTIVE;
  FASTUDY_H5((Where{"", "transfer property list"}), H5Pget_mpio_actual_io_mode, plist_.id(), &mode);
  switch (mode) {
    case H5D_MPIO_NO_COLLECTIVE: return "none";
    case H5D_MPIO_CHUNK_INDEPENDENT: return "chunk-independent";
    case H5D_MPIO_CHUNK_COLLECTIVE: return "chunk-collective";
    case H5D_MPIO_CHUNK_MIXED: return "chunk-mixed";
    case H5D_MPIO_CONTIGUOUS_COLLECTIVE: return "contiguous-collective";
  }
  return "unknown";
}

// ---- datasets -------------------------------------------------------------------------------------

std::vector<std::int64_t> Dataset::shape() const {
  Handle space = space_of_dataset(id(), where_);
  if (FASTUDY_H5(where_, H5Sget_simple_extent_type, space.id()) == H5S_NULL) return {0};
  std::vector<std::int64_t> out;
  for (hsize_t d : dims_of(space.id(), where_)) out.push_back(static_cast<std::int64_t>(d));
  return out;
}

std::int64_t Dataset::numel() const {
  std::int64_t n = 1;
  for (auto d : shape()) n *= d;
  return n;
}

DType Dataset::dtype() const {
  Handle type(FASTUDY_H5(where_, H5Dget_type, id()), close_type);
  H5T_class_t cls = type_class(type.id(), where_);
  std::size_t size = type_size(type.id(), where_);
  if (cls == H5T_FLOAT && size == 4) return DType::f32;
  if (cls == H5T_FLOAT && size == 8) return DType::f64;
  if (cls == H5T_INTEGER && size == 8) return DType::i64;
  if (cls == H5T_INTEGER && size == 1) return DType::u8;
  throw H5Error("H5Dget_type", where_.file, where_.object,
                "unsupported element type (class " + std::to_string(static_cast<int>(cls)) + ", " +
                    std::to_string(size) + " bytes); fastudy stores f32, f64, i64 and u8",
                __FILE__, __LINE__);
}

StoredType Dataset::stored_type() const {
  Handle type(FASTUDY_H5(where_, H5Dget_type, id()), close_type);
  StoredType t;
  t.bytes = type_size(type.id(), where_);
  const H5T_class_t cls = type_class(type.id(), where_);
  if (cls == H5T_INTEGER) t.cls = StoredType::Class::integer;
  if (cls == H5T_FLOAT) {
    t.cls = StoredType::Class::floating;
    std::size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
    FASTUDY_H5(where_, H5Tget_fields, type.id(), &spos, &epos, &esize, &mpos, &msize);
    t.exponent_bits = static_cast<int>(esize);
    t.mantissa_bits = static_cast<int>(msize);
  }
  return t;
}

void Dataset::read_rows_converted(double* buf, std::int64_t row0, std::int64_t rows) const {
  transfer(buf, row0, rows, H5P_DEFAULT, false, H5T_NATIVE_DOUBLE);
}

void Dataset::read_rows_converted(float* buf, std::int64_t row0, std::int64_t rows) const {
  transfer(buf, row0, rows, H5P_DEFAULT, false, H5T_NATIVE_FLOAT);
}

void Dataset::transfer(void* buf, std::int64_t row0, std::int64_t rows, hid_t xfer, bool write,
                       hid_t converted_to) const {
  Handle file_space = space_of_dataset(id(), where_);
  std::vector<hsize_t> dims = dims_of(file_space.id(), where_);
  const std::int64_t total_rows = dims.empty() ? 1 : static_cast<std::int64_t>(dims[0]);
  if (row0 < 0 || rows < 0 || row0 + rows > total_rows) {
    throw H5Error(write ? "H5Dwrite" : "H5Dread", where_.file, where_.object,
                  "rows [" + std::to_string(row0) + ", " + std::to_string(row0 + rows) + ") outside the " +
                      std::to_string(total_rows) + " rows of the dataset",
                  __FILE__, __LINE__);
  }
  hsize_t row_elems = 1;
  for (std::size_t i = 1; i < dims.size(); ++i) row_elems *= dims[i];
  const hsize_t elems = static_cast<hsize_t>(rows) * row_elems;
  Handle mem_space = simple_space({elems}, where_);
  if (elems == 0) {
    for (hid_t space : {mem_space.id(), file_space.id()}) FASTUDY_H5(where_, H5Sselect_none, space);
  } else if (!dims.empty()) {
    std::vector<hsize_t> start(dims.size(), 0), count = dims;
    start[0] = static_cast<hsize_t>(row0);
    count[0] = static_cast<hsize_t>(rows);
    FASTUDY_H5(where_, H5Sselect_hyperslab, file_space.id(), H5S_SELECT_SET, start.data(), nullptr,
               count.data(), nullptr);
  }
  const hid_t mem_type = converted_to >= 0 ? converted_to : memory_type(dtype());
  if (write) {
    FASTUDY_H5_WRITE(where_, H5Dwrite, id(), mem_type, mem_space.id(), file_space.id(), xfer, buf);
  } else {
    FASTUDY_H5(where_, H5Dread, id(), mem_type, mem_space.id(), file_space.id(), xfer, buf);
  }
}

void Dataset::write_rows(const void* buf, std::int64_t row0, std::int64_t rows, const Transfer& xfer) {
  transfer(const_cast<void*>(buf), row0, rows, xfer.id(), true);
}

void Dataset::read_rows(void* buf, std::int64_t row0, std::int64_t rows, const Transfer& xfer) const {
  transfer(buf, row0, rows, xfer.id(), false);
}

void Dataset::read_all(void* buf) const {
  auto s = shape();
  transfer(buf, 0, s.empty() ? 1 : s[0], H5P_DEFAULT, false);
}

std::int64_t Dataset::file_offset() const {
  const haddr_t at = H5Dget_offset(id());  // HADDR_UNDEF, not an error, without contiguous storage
  clear_errors();
  return at == HADDR_UNDEF ? -1 : static_cast<std::int64_t>(at);
}

StorageInfo Dataset::storage() const {
  StorageInfo info;
  Handle dcpl(FASTUDY_H5(where_, H5Dget_create_plist, id()), close_plist);
  switch (FASTUDY_H5(where_, H5Pget_layout, dcpl.id())) {
    case H5D_COMPACT: info.layout = StorageInfo::Layout::compact; break;
    case H5D_CONTIGUOUS: info.layout = StorageInfo::Layout::contiguous; break;
    case H5D_CHUNKED: info.layout = StorageInfo::Layout::chunked; break;
    case H5D_VIRTUAL: info.layout = StorageInfo::Layout::virtual_; break;
    default: break;
  }
  info.filters = FASTUDY_H5(where_, H5Pget_nfilters, dcpl.id());
  info.external_files = FASTUDY_H5(where_, H5Pget_external_count, dcpl.id());
  if (info.layout == StorageInfo::Layout::virtual_) return info;  // its storage is other files'
  H5D_space_status_t status = H5D_SPACE_STATUS_ERROR;
  FASTUDY_H5(where_, H5Dget_space_status, id(), &status);
  info.allocated = status == H5D_SPACE_STATUS_ALLOCATED;
  info.stored_bytes = H5Dget_storage_size(id());  // 0 without storage (not an error code)
  clear_errors();
  return info;
}

// ---- groups ---------------------------------------------------------------------------------------

std::string Group::child_path(const std::string& name) const {
  return where_.object == "/" ? "/" + name : where_.object + "/" + name;
}

Group Group::create_group(const std::string& name) {
  Where w{where_.file, child_path(name)};
  Handle gcpl = plist(H5P_GROUP_CREATE, w);
  FASTUDY_H5(w, H5Pset_link_creation_order, gcpl.id(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  Handle g(FASTUDY_H5_WRITE(w, H5Gcreate2, id(), name.c_str(), H5P_DEFAULT, gcpl.id(), H5P_DEFAULT), close_group);
  return Group(std::move(g), w);
}

Group Group::open_group(const std::string& name) const {
  Where w{where_.file, child_path(name)};
  return Group(open_group_handle(id(), name, w), w);
}

bool Group::has(const std::string& name) const {
  return FASTUDY_H5(where_, H5Lexists, id(), name.c_str(), link_access()) > 0;
}

std::vector<std::string> Group::children() const {
  Handle gcpl(FASTUDY_H5(where_, H5Gget_create_plist, id()), close_plist);
  unsigned flags = 0;
  FASTUDY_H5(where_, H5Pget_link_creation_order, gcpl.id(), &flags);
  const H5_index_t index = (flags & H5P_CRT_ORDER_INDEXED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
  std::vector<std::string> names;
  FASTUDY_H5(where_, H5Literate, id(), index, H5_ITER_INC, nullptr, collect_link_name, &names);
  return names;
}

Group::Kind Group::child_kind(const std::string& name) const {
  const LinkInfo l = link(name);
  if (l.type != LinkInfo::Type::hard && l.type != LinkInfo::Type::soft) return Kind::other;
  Where w{where_.file, child_path(name)};
  if (FASTUDY_H5(w, H5Oexists_by_name, id(), name.c_str(), link_access()) <= 0) return Kind::other;
  return object(name).kind;
}

LinkInfo Group::link(const std::string& name) const {
  Where w{where_.file, child_path(name)};
  H5L_info_t info{};
  FASTUDY_H5(w, H5Lget_info, id(), name.c_str(), &info, link_access());
  LinkInfo out;
  switch (info.type) {
    case H5L_TYPE_HARD: out.type = LinkInfo::Type::hard; return out;
    case H5L_TYPE_SOFT: out.type = LinkInfo::Type::soft; break;
    case H5L_TYPE_EXTERNAL: out.type = LinkInfo::Type::external; break;
    default: out.target = std::to_string(static_cast<int>(info.type)); return out;
  }
  // The link's value: a soft link's path, an external link's flags, file and object (at most 64 KiB
  // of it, which holds any path a reader would follow).
  const std::size_t size = std::min<std::size_t>(info.u.val_size, std::size_t{64} << 10);
  std::string value(size, '\0');
  if (size > 0) FASTUDY_H5(w, H5Lget_val, id(), name.c_str(), value.data(), size, link_access());
  if (out.type == LinkInfo::Type::soft) {
    out.target = value.substr(0, value.find('\0'));
    return out;
  }
  unsigned flags = 0;
  const char* file = nullptr;
  const char* object = nullptr;
  FASTUDY_H5(w, H5Lunpack_elink_val, value.data(), size, &flags, &file, &object);
  out.target = std::string(file ? file : "") + ":" + (object ? object : "");
  return out;
}

Group::Object Group::object(const std::string& name) const {
  Where w{where_.file, child_path(name)};
  H5O_info_t info{};
  FASTUDY_H5(w, H5Oget_info_by_name2, id(), name.c_str(), &info, H5O_INFO_BASIC, link_access());
  Object o;
  o.kind = info.type == H5O_TYPE_GROUP ? Kind::group : info.type == H5O_TYPE_DATASET ? Kind::dataset : Kind::other;
  o.fileno = info.fileno;
  o.address = static_cast<std::uint64_t>(info.addr);
  return o;
}

Dataset Group::create_dataset(const std::string& name, DType dtype, const std::vector<std::int64_t>& shape) {
  Where w{where_.file, child_path(name)};
  Handle space;
  if (shape.empty()) {
    space = scalar_space(w);
  } else {
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    space = simple_space(dims, w);
  }
  Handle dcpl = plist(H5P_DATASET_CREATE, w);
  FASTUDY_H5(w, H5Pset_fill_time, dcpl.id(), H5D_FILL_TIME_NEVER);
  Handle d(FASTUDY_H5_WRITE(w, H5Dcreate2, id(), name.c_str(), file_type(dtype), space.id(), H5P_DEFAULT, dcpl.id(),
                      H5P_DEFAULT),
           close_dataset);
  return Dataset(std::move(d), w);
}

Dataset Group::open_dataset(const std::string& name) const {
  Where w{where_.file, child_path(name)};
  Handle d(FASTUDY_H5(w, H5Dopen2, id(), name.c_str(), dataset_access()), close_dataset);
  return Dataset(std::move(d), w);
}

// ---- files ----------------------------------------------------------------------------------------

namespace {
Handle file_access(const mpi::Comm* comm, const Where& w) {
  Handle fapl = plist(H5P_FILE_ACCESS, w);
  // A serial file is closed strongly: its objects still open are closed with it, so that close() flushes
  // everything and reports a write that fails (a full disk) then, instead of deferring the real close
  // (HDF5's default for serial files) to the last object's silent close. A parallel file keeps the
  // MPI-IO driver's degree (semi: closing it with objects open is an error).
  if (comm == nullptr) FASTUDY_H5(w, H5Pset_fclose_degree, fapl.id(), H5F_CLOSE_STRONG);
  if (comm != nullptr) {
    FASTUDY_H5(w, H5Pset_fapl_mpio, fapl.id(), comm->raw(), MPI_INFO_NULL);
    FASTUDY_H5(w, H5Pset_coll_metadata_write, fapl.id(), 1);
    FASTUDY_H5(w, H5Pset_all_coll_metadata_ops, fapl.id(), 1);
  }
  return fapl;
}
}  // namespace

File File::create(const std::string& path, const mpi::Comm* comm) {
  silence_automatic_printing();
  Where w{path, ""};
  Handle fapl = file_access(comm, w);
  Handle f(FASTUDY_H5_WRITE(w, H5Fcreate, path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id()), close_file);
  return File(std::move(f), path, comm != nullptr);
}

File File::open(const std::string& path, bool writable, const mpi::Comm* comm) {
  silence_automatic_printing();
  Where w{path, ""};
  Handle fapl = file_access(comm, w);
  Handle f(FASTUDY_H5(w, H5Fopen, path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl.id()),
           close_file);
  return File(std::move(f), path, comm != nullptr);
}

bool File::is_hdf5(const std::string& path) {
  silence_automatic_printing();
  htri_t r = H5Fis_hdf5(path.c_str());
  clear_errors();
  return r > 0;
}

Group File::root() const {
  Where w{path_, "/"};
  return Group(open_group_handle(handle_.id(), "/", w), w);
}

void File::close() {
  if (handle_.id() < 0) return;
  const hid_t id = handle_.release();  // the checked close below takes it
  FASTUDY_H5_WRITE((Where{path_, ""}), close_file, id);
}

void File::abandon() noexcept { handle_.release(); }

int failed_closes() { return g_failed_closes.load(); }

}  // namespace fastudy::h5
