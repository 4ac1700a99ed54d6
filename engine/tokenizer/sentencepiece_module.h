// The C ABI between engine/tokenizer/tokenizer.cc and libmegatrain_sentencepiece.so,
// the loadable module that holds every call into SentencePiece.
//
// Why a module (Note [SentencePiece module] in tokenizer.cc): Debian's
// libsentencepiece bundles and exports its own protobuf-lite (3.14), while
// LibTorch and gRPC load libprotobuf 3.21; linked into one program the two
// bind to each other's symbols and the process dies before main(). The
// module is opened with dlopen(RTLD_LOCAL | RTLD_DEEPBIND), so SentencePiece
// binds to its own protobuf and nothing else sees it.
//
// Plain C types only: no C++ object, exception or allocation crosses the
// boundary (the caller owns every buffer). Error messages are written into
// caller buffers, truncated and NUL-terminated.
#ifndef MEGATRAIN_ENGINE_SENTENCEPIECE_MODULE_H_
#define MEGATRAIN_ENGINE_SENTENCEPIECE_MODULE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Bumped whenever a signature below changes; tokenizer.cc refuses a module
// reporting another version.
#define MEGATRAIN_SPM_ABI_VERSION 1

// Returns MEGATRAIN_SPM_ABI_VERSION of the module's build.
typedef int (*MegatrainSpmAbiVersionFn)(void);

// Loads the model file `path`; returns an opaque processor, or NULL with a
// message in `error` (`error_bytes` bytes, NUL-terminated).
typedef void* (*MegatrainSpmLoadFn)(const char* path, char* error, size_t error_bytes);

// Frees a processor from load (NULL is ignored).
typedef void (*MegatrainSpmFreeFn)(void* processor);

// Encodes `text_bytes` bytes of UTF-8 text. Writes min(n, capacity) ids to
// `ids` and returns n, the number of ids (call again with a larger buffer
// when n > capacity); returns -1 with a message in `error` on failure.
// Thread-safe for one processor.
typedef int64_t (*MegatrainSpmEncodeFn)(void* processor, const char* text, size_t text_bytes,
                                        int32_t* ids, size_t capacity, char* error,
                                        size_t error_bytes);

// Decodes `count` ids (each in [0, piece_size)). Writes min(n, capacity)
// bytes of text to `text` (not NUL-terminated) and returns n, the text's
// length in bytes; -1 with a message in `error` on failure. Thread-safe.
typedef int64_t (*MegatrainSpmDecodeFn)(void* processor, const int32_t* ids, size_t count,
                                        char* text, size_t capacity, char* error,
                                        size_t error_bytes);

// Number of pieces (the vocabulary size).
typedef int32_t (*MegatrainSpmPieceSizeFn)(void* processor);

// Which special id megatrain_spm_special_id returns.
enum MegatrainSpmSpecial {
  kMegatrainSpmUnk = 0,
  kMegatrainSpmBos = 1,
  kMegatrainSpmEos = 2,
  kMegatrainSpmPad = 3,
};
// The id of a special piece; -1 when the model has none.
typedef int32_t (*MegatrainSpmSpecialIdFn)(void* processor, int which);

#ifdef __cplusplus
}  // extern "C"
#endif

// Exported symbol names, in the order of the typedefs above.
#define MEGATRAIN_SPM_SYMBOL_ABI_VERSION "megatrain_spm_abi_version"
#define MEGATRAIN_SPM_SYMBOL_LOAD "megatrain_spm_load"
#define MEGATRAIN_SPM_SYMBOL_FREE "megatrain_spm_free"
#define MEGATRAIN_SPM_SYMBOL_ENCODE "megatrain_spm_encode"
#define MEGATRAIN_SPM_SYMBOL_DECODE "megatrain_spm_decode"
#define MEGATRAIN_SPM_SYMBOL_PIECE_SIZE "megatrain_spm_piece_size"
#define MEGATRAIN_SPM_SYMBOL_SPECIAL_ID "megatrain_spm_special_id"

// File name of the module (CMake target megatrain_sentencepiece).
#define MEGATRAIN_SPM_MODULE_FILE "libmegatrain_sentencepiece.so"

#endif  // MEGATRAIN_ENGINE_SENTENCEPIECE_MODULE_H_
