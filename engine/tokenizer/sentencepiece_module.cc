// libmegatrain_sentencepiece.so: SentencePiece behind the C ABI of
// sentencepiece_module.h. Loaded by engine/tokenizer/tokenizer.cc with dlopen; never
// linked into a program (see Note [SentencePiece module] in tokenizer.cc).
//
// Only the functions below are exported (the target builds with hidden
// visibility). No exception leaves a function: SentencePiece and the
// standard library may throw (e.g. std::ios_base::failure when a model path
// is a directory, std::bad_alloc), so every body catches everything.
//
// No Abseil here: SentencePiece's header declares absl::string_view as
// std::string_view, which clashes with Debian's Abseil.
#include "engine/tokenizer/sentencepiece_module.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#define MEGATRAIN_SPM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

void SetError(char* error, size_t error_bytes, const std::string& message) {
  if (error == nullptr || error_bytes == 0) return;
  const size_t length = std::min(message.size(), error_bytes - 1);
  std::memcpy(error, message.data(), length);
  error[length] = '\0';
}

sentencepiece::SentencePieceProcessor* AsProcessor(void* processor) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(processor);
}

}  // namespace

MEGATRAIN_SPM_EXPORT int megatrain_spm_abi_version(void) { return MEGATRAIN_SPM_ABI_VERSION; }

MEGATRAIN_SPM_EXPORT void* megatrain_spm_load(const char* path, char* error, size_t error_bytes) {
  try {
    auto processor = std::make_unique<sentencepiece::SentencePieceProcessor>();
    const sentencepiece::util::Status status = processor->Load(std::string_view(path));
    if (!status.ok()) {
      SetError(error, error_bytes, status.ToString());
      return nullptr;
    }
    return processor.release();
  } catch (const std::exception& e) {
    SetError(error, error_bytes, e.what());
  } catch (...) {
    SetError(error, error_bytes, "unknown exception");
  }
  return nullptr;
}

MEGATRAIN_SPM_EXPORT void megatrain_spm_free(void* processor) { delete AsProcessor(processor); }

MEGATRAIN_SPM_EXPORT int64_t megatrain_spm_encode(void* processor, const char* text,
                                                  size_t text_bytes, int32_t* ids, size_t capacity,
                                                  char* error, size_t error_bytes) {
  try {
    std::vector<int> encoded;
    const sentencepiece::util::Status status =
        AsProcessor(processor)->Encode(std::string_view(text, text_bytes), &encoded);
    if (!status.ok()) {
      SetError(error, error_bytes, status.ToString());
      return -1;
    }
    const size_t count = std::min(encoded.size(), capacity);
    for (size_t pos = 0; pos < count; ++pos) ids[pos] = encoded[pos];
    return static_cast<int64_t>(encoded.size());
  } catch (const std::exception& e) {
    SetError(error, error_bytes, e.what());
  } catch (...) {
    SetError(error, error_bytes, "unknown exception");
  }
  return -1;
}

MEGATRAIN_SPM_EXPORT int64_t megatrain_spm_decode(void* processor, const int32_t* ids, size_t count,
                                                  char* text, size_t capacity, char* error,
                                                  size_t error_bytes) {
  try {
    const std::vector<int> pieces(ids, ids + count);
    std::string decoded;
    const sentencepiece::util::Status status = AsProcessor(processor)->Decode(pieces, &decoded);
    if (!status.ok()) {
      SetError(error, error_bytes, status.ToString());
      return -1;
    }
    std::memcpy(text, decoded.data(), std::min(decoded.size(), capacity));
    return static_cast<int64_t>(decoded.size());
  } catch (const std::exception& e) {
    SetError(error, error_bytes, e.what());
  } catch (...) {
    SetError(error, error_bytes, "unknown exception");
  }
  return -1;
}

MEGATRAIN_SPM_EXPORT int32_t megatrain_spm_piece_size(void* processor) {
  return AsProcessor(processor)->GetPieceSize();
}

MEGATRAIN_SPM_EXPORT int32_t megatrain_spm_special_id(void* processor, int which) {
  const sentencepiece::SentencePieceProcessor* p = AsProcessor(processor);
  switch (which) {
    case kMegatrainSpmUnk:
      return p->unk_id();
    case kMegatrainSpmBos:
      return p->bos_id();
    case kMegatrainSpmEos:
      return p->eos_id();
    case kMegatrainSpmPad:
      return p->pad_id();
    default:
      return -1;
  }
}
