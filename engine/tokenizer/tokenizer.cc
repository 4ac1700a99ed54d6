// Tokenizer: SentencePiece through libmegatrain_sentencepiece.so.
//
// Note [SentencePiece module]
// Debian's libsentencepiece.so.0 (0.1.97) is built with its bundled
// protobuf-lite 3.14 and exports those protobuf symbols. LibTorch
// (libtorch_cpu) and gRPC load the system libprotobuf.so.32 (3.21). In one
// program with a flat symbol namespace the two bind to each other's symbols:
// with libsentencepiece first, libprotobuf's static initialisers run
// sentencepiece's copy and crash (SIGSEGV before main); with libprotobuf
// first, sentencepiece's descriptors fail protobuf's version check and abort.
// So no MegaTrain program may link libsentencepiece.
//
// Instead, every SentencePiece call lives in sentencepiece_module.cc, built
// as the loadable module libmegatrain_sentencepiece.so (linked against
// libsentencepiece), which this file opens with
//   dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND):
// RTLD_DEEPBIND makes the module and libsentencepiece resolve their own
// symbols (sentencepiece's protobuf) before the program's, and RTLD_LOCAL
// keeps them out of the global namespace, so libprotobuf never sees them.
// The interface is the C ABI of sentencepiece_module.h. The module is never
// unloaded.
//
// Sanitizers: the ASan and TSan runtimes abort on RTLD_DEEPBIND, so those
// builds report UNIMPLEMENTED instead (the tokenizer tests skip).
//
// The module also keeps SentencePiece's header, which declares
// absl::string_view as std::string_view, away from Debian's Abseil (whose
// absl::string_view is its own class).
#include "engine/tokenizer/tokenizer.h"

#include "engine/fs/dir_fd.h"
#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/runtime/status_macros.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/tokenizer/sentencepiece_module.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MEGATRAIN_DEEPBIND_UNSUPPORTED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MEGATRAIN_DEEPBIND_UNSUPPORTED 1
#endif

namespace megatrain::engine {

namespace {

// Room for the module's error messages, in bytes.
constexpr size_t kErrorBytes = 1024;

// The module's entry points.
struct SpmModule {
  std::string path;
  MegatrainSpmLoadFn load = nullptr;
  MegatrainSpmFreeFn free = nullptr;
  MegatrainSpmEncodeFn encode = nullptr;
  MegatrainSpmDecodeFn decode = nullptr;
  MegatrainSpmPieceSizeFn piece_size = nullptr;
  MegatrainSpmSpecialIdFn special_id = nullptr;
};

// Directory of the running executable, "" when unknown.
std::string ExecutableDir() {
  std::string buffer(4096, '\0');
  const ssize_t length = ::readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
  if (length <= 0) return "";
  buffer.resize(static_cast<size_t>(length));
  const size_t slash = buffer.rfind('/');
  return slash == std::string::npos ? "" : buffer.substr(0, slash);
}

template <typename Fn>
absl::Status FindSymbol(void* handle, const std::string& path, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(::dlsym(handle, name));
  if (*fn == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": SentencePiece module lacks symbol ", name, " (stale build?)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SpmModule> OpenModule() {
#ifdef MEGATRAIN_DEEPBIND_UNSUPPORTED
  return absl::UnimplementedError(
      "SentencePiece is unavailable in ASan/TSan builds: the sanitizer "
      "runtime refuses dlopen(RTLD_DEEPBIND), which the SentencePiece module "
      "needs (Note [SentencePiece module] in engine/tokenizer/tokenizer.cc)");
#else
  const std::vector<std::string> candidates = Tokenizer::ModuleSearchPath();
  for (const std::string& path : candidates) {
    if (::access(path.c_str(), F_OK) != 0) continue;
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": cannot load the SentencePiece module: ", ::dlerror()));
    }
    SpmModule module;
    module.path = path;
    MegatrainSpmAbiVersionFn abi_version = nullptr;
    absl::Status status = FindSymbol(handle, path, MEGATRAIN_SPM_SYMBOL_ABI_VERSION, &abi_version);
    if (status.ok() && abi_version() != MEGATRAIN_SPM_ABI_VERSION) {
      status = absl::FailedPreconditionError(
          absl::StrCat(path, ": SentencePiece module ABI version ", abi_version(),
                       ", this build needs ", MEGATRAIN_SPM_ABI_VERSION, " (stale build?)"));
    }
    if (status.ok()) {
      status = FindSymbol(handle, path, MEGATRAIN_SPM_SYMBOL_LOAD, &module.load);
    }
    if (status.ok()) {
      status = FindSymbol(handle, path, MEGATRAIN_SPM_SYMBOL_FREE, &module.free);
    }
    if (status.ok()) {
      status = FindSymbol(handle, path, MEGATRAIN_SPM_SYMBOL_ENCODE, &module.encode);
    }
    if (status.ok()) {
      status = FindSymbol(handle, path, MEGATRAIN_SPM_SYMBOL_DECODE, &module.decode);
    }
    if (status.ok()) {
      status = FindSymbol(handle, path, MEGATRAIN_SPM_SYMBOL_PIECE_SIZE, &module.piece_size);
    }
    if (status.ok()) {
      status = FindSymbol(handle, path, MEGATRAIN_SPM_SYMBOL_SPECIAL_ID, &module.special_id);
    }
    if (!status.ok()) {
      ::dlclose(handle);
      return status;
    }
    return module;  // `handle` stays open for the life of the process
  }
  return absl::FailedPreconditionError(
      absl::StrCat("SentencePiece module " MEGATRAIN_SPM_MODULE_FILE " not found (looked "
                   "in: ",
                   absl::StrJoin(candidates, ", "),
                   "); install it next to the executable or set "
                   "MEGATRAIN_SENTENCEPIECE_MODULE"));
#endif
}

// The module, opened on first use (thread-safe); a failure is permanent for
// the process.
const absl::StatusOr<SpmModule>& Module() {
  static const absl::StatusOr<SpmModule>* const module =
      new absl::StatusOr<SpmModule>(OpenModule());
  return *module;
}

}  // namespace

std::vector<std::string> Tokenizer::ModuleSearchPath() {
  if (const char* env = std::getenv("MEGATRAIN_SENTENCEPIECE_MODULE");
      env != nullptr && env[0] != '\0') {
    return {env};
  }
  std::vector<std::string> paths;
  const std::string exe_dir = ExecutableDir();
  if (!exe_dir.empty()) {
    paths.push_back(exe_dir + "/" MEGATRAIN_SPM_MODULE_FILE);
    paths.push_back(exe_dir + "/../lib/" MEGATRAIN_SPM_MODULE_FILE);
  }
#ifdef MEGATRAIN_SENTENCEPIECE_MODULE_PATH
  paths.push_back(MEGATRAIN_SENTENCEPIECE_MODULE_PATH);
#endif
  return paths;
}

void Tokenizer::ProcessorDeleter::operator()(void* processor) const {
  // A processor exists only if the module loaded.
  if (processor != nullptr) Module()->free(processor);
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<Tokenizer> Tokenizer::Load(const std::string& model_path) {
  struct stat dir_info;
  const bool is_dir = ::stat(model_path.c_str(), &dir_info) == 0 && S_ISDIR(dir_info.st_mode);
  if (is_dir || HfTokenizer::LooksLikeHfTokenizer(model_path)) {
    MEGATRAIN_ASSIGN_OR_RETURN(HfTokenizer hf, HfTokenizer::Load(model_path));
    Tokenizer tokenizer;
    tokenizer.path_ = model_path;
    tokenizer.vocab_size_ = hf.vocab_size();
    tokenizer.unk_id_ = hf.unk_id();
    tokenizer.bos_id_ = hf.bos_id();
    tokenizer.eos_id_ = hf.eos_id();
    tokenizer.pad_id_ = hf.pad_id();
    tokenizer.hf_ = std::make_shared<const HfTokenizer>(std::move(hf));
    return tokenizer;
  }
  // Open the file ourselves (Note [Confined reads] in dir_fd.h: below the
  // job's roots, never a FIFO), and let SentencePiece read that very file
  // through /proc/self/fd. Also, its codes for a missing file vary between
  // versions, and it throws on a directory.
  absl::StatusOr<int> fd = OpenInputFile(model_path);
  if (absl::IsNotFound(fd.status())) {
    return absl::NotFoundError(
        absl::StrCat(model_path, ": SentencePiece model not found (no such file)"));
  }
  if (absl::IsInvalidArgument(fd.status())) {
    return absl::InvalidArgumentError(
        absl::StrCat(fd.status().message(), " (expected a SentencePiece .model)"));
  }
  if (!fd.ok()) return fd.status();
  const std::string fd_path = absl::StrCat("/proc/self/fd/", *fd);
  const absl::StatusOr<SpmModule>& module = Module();
  if (!module.ok()) {
    ::close(*fd);
    return absl::Status(module.status().code(),
                        absl::StrCat(model_path, ": ", module.status().message()));
  }
  char error[kErrorBytes] = "";
  void* processor = module->load(fd_path.c_str(), error, sizeof(error));
  ::close(*fd);
  if (processor == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_path, ": not a valid SentencePiece model (", error, ")"));
  }
  Tokenizer tokenizer;
  tokenizer.path_ = model_path;
  tokenizer.processor_.reset(processor);
  tokenizer.vocab_size_ = module->piece_size(processor);
  tokenizer.unk_id_ = module->special_id(processor, kMegatrainSpmUnk);
  tokenizer.bos_id_ = module->special_id(processor, kMegatrainSpmBos);
  tokenizer.eos_id_ = module->special_id(processor, kMegatrainSpmEos);
  tokenizer.pad_id_ = module->special_id(processor, kMegatrainSpmPad);
  if (tokenizer.vocab_size_ <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_path, ": SentencePiece model has an empty vocabulary"));
  }
  return tokenizer;
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text) const {
  if (hf_ != nullptr) return hf_->Encode(text);
  const SpmModule& module = *Module();
  // SentencePiece gives at most about one id per byte (byte fallback), plus
  // a word-boundary piece: try once with that, again if it was too small.
  std::vector<int32_t> ids(text.size() + 8);
  char error[kErrorBytes] = "";
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int64_t count = module.encode(processor_.get(), text.data(), text.size(), ids.data(),
                                        ids.size(), error, sizeof(error));
    if (count < 0) {
      return absl::InternalError(absl::StrCat(path_, ": SentencePiece Encode failed: ", error));
    }
    const bool fits = static_cast<size_t>(count) <= ids.size();
    ids.resize(static_cast<size_t>(count));
    if (fits) return ids;
  }
  return absl::InternalError(absl::StrCat(path_, ": SentencePiece Encode gave a changing length"));
}

absl::Status Tokenizer::EncodeWithSpans(absl::string_view text, std::vector<int32_t>* ids,
                                        std::vector<std::pair<size_t, size_t>>* spans) const {
  if (hf_ == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        path_, ": token offsets need a Hugging Face tokenizer.json, not a SentencePiece model"));
  }
  MEGATRAIN_ASSIGN_OR_RETURN(HfTokenizer::Encoding encoding, hf_->EncodeWithOffsets(text));
  *ids = std::move(encoding.ids);
  *spans = std::move(encoding.spans);
  return absl::OkStatus();
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids) const {
  for (size_t pos = 0; pos < ids.size(); ++pos) {
    if (ids[pos] < 0 || ids[pos] >= vocab_size_) {
      return absl::OutOfRangeError(absl::StrCat(path_, ": id ", ids[pos], " at position ", pos,
                                                " is outside [0, ", vocab_size_, ")"));
    }
  }
  if (hf_ != nullptr) return hf_->Decode(ids);
  const SpmModule& module = *Module();
  // A piece is rarely longer than 16 bytes; retry once with the exact size.
  std::string text(16 * ids.size() + 16, '\0');
  char error[kErrorBytes] = "";
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int64_t length = module.decode(processor_.get(), ids.data(), ids.size(), text.data(),
                                         text.size(), error, sizeof(error));
    if (length < 0) {
      return absl::InternalError(absl::StrCat(path_, ": SentencePiece Decode failed: ", error));
    }
    const bool fits = static_cast<size_t>(length) <= text.size();
    text.resize(static_cast<size_t>(length));
    if (fits) return text;
  }
  return absl::InternalError(absl::StrCat(path_, ": SentencePiece Decode gave a changing length"));
}

}  // namespace megatrain::engine
