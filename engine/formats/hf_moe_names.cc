// MoE parameter names, HF import and export (see hf_moe_names.h).
#include "engine/formats/hf_moe_names.h"

#include <array>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/formats/mxfp4.h"
#include "engine/runtime/status_macros.h"

namespace megatrain::engine {
namespace {

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

bool PerExpertOnDisk(const MoeConfig& m) { return m.family != MoeFamily::kGptOss; }

// On-disk names of expert `e`'s gate, up and down projections
// (mixtral w1/w3/w2 under block_sparse_moe; qwen gate/up/down_proj).
std::array<std::string, 3> PerExpertNames(const MoeConfig& m, int64_t layer_idx, int64_t e) {
  if (m.family == MoeFamily::kMixtral) {
    const std::string p =
        absl::StrCat("model.layers.", layer_idx, ".block_sparse_moe.experts.", e, ".");
    return {p + "w1.weight", p + "w3.weight", p + "w2.weight"};
  }
  const std::string p = absl::StrCat("model.layers.", layer_idx, ".mlp.experts.", e, ".");
  return {p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"};
}

// One tensor of a form: its on-disk name and shape; `packed` for MXFP4's
// uint8 blocks and scales.
struct DiskPart {
  std::string name;
  std::vector<int64_t> shape;
  bool packed = false;
};

// One way a parameter can be stored. The parts' values, concatenated in
// order, are the parameter in row-major order, except for MXFP4 (parts
// blocks, scales), decoded to [E, R, 32*G] then transposed to [E, 32*G, R].
struct Form {
  std::vector<DiskPart> parts;
  bool mxfp4 = false;
};

// Decoder layer index of an HF name ("model.layers.3.x" -> 3), -1 for
// parameters outside the layers.
int64_t LayerOf(const std::string& hf_name) {
  static const std::string kPrefix = "model.layers.";
  if (hf_name.rfind(kPrefix, 0) != 0) return -1;
  const size_t dot = hf_name.find('.', kPrefix.size());
  return std::stoll(hf_name.substr(kPrefix.size(), dot - kPrefix.size()));
}

// Every accepted form of parameter `p` of layer `layer_idx`.
std::vector<Form> FormsOf(const MoeModelConfig& c, const ParamSpec& p, int64_t layer_idx) {
  std::vector<Form> forms;
  forms.push_back(Form{{DiskPart{p.hf_name, p.shape}}});
  if (layer_idx < 0) return forms;
  const MoeConfig& m = c.moe;
  const int64_t e_count = m.num_experts;
  const int64_t fe = m.moe_intermediate_size, hidden = c.base.hidden_size;
  if (m.family == MoeFamily::kMixtral && p.local_name == "mlp.gate.weight") {
    forms.push_back(Form{{DiskPart{
        absl::StrCat("model.layers.", layer_idx, ".block_sparse_moe.gate.weight"), p.shape}}});
  }
  const bool gate_up = p.local_name == "mlp.experts.gate_up_proj";
  const bool down = p.local_name == "mlp.experts.down_proj";
  if ((gate_up || down) && PerExpertOnDisk(m)) {
    Form f;
    for (int64_t e = 0; e < e_count; ++e) {
      auto names = PerExpertNames(m, layer_idx, e);
      if (gate_up) {
        f.parts.push_back(DiskPart{names[0], {fe, hidden}});
        f.parts.push_back(DiskPart{names[1], {fe, hidden}});
      } else {
        f.parts.push_back(DiskPart{names[2], {hidden, fe}});
      }
    }
    forms.push_back(std::move(f));
  }
  if ((gate_up || down) && m.family == MoeFamily::kGptOss) {
    // Released layout: rows R are the output features (2*Fe or C), the
    // blocks run over the input features (C or Fe).
    const int64_t rows = gate_up ? 2 * fe : hidden;
    const int64_t cols = gate_up ? hidden : fe;
    if (cols % kMxfp4BlockElements == 0) {
      const int64_t groups = cols / kMxfp4BlockElements;
      forms.push_back(
          Form{{DiskPart{p.hf_name + "_blocks", {e_count, rows, groups, kMxfp4BlockBytes}, true},
                DiskPart{p.hf_name + "_scales", {e_count, rows, groups}, true}},
               /*mxfp4=*/true});
    }
  }
  return forms;
}

bool IsFloatDtype(SafetensorsDtype d) {
  return d == SafetensorsDtype::kF32 || d == SafetensorsDtype::kBF16 || d == SafetensorsDtype::kF16;
}

// Checks that every part of `form` is on disk with its shape and dtype.
absl::Status CheckForm(const SafetensorsModel& model, const ParamSpec& p, const Form& form) {
  for (size_t i = 0; i < form.parts.size(); ++i) {
    const DiskPart& part = form.parts[i];
    auto ref = model.Find(part.name);
    if (!ref.ok()) {
      return absl::NotFoundError(absl::StrCat("tensor '", part.name, "' missing (part ", i + 1,
                                              " of ", form.parts.size(), " of parameter '",
                                              p.hf_name, "')"));
    }
    const SafetensorsTensorInfo& info = *ref->info;
    if (info.shape != part.shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", part.name, "': shape ",
                                                     ShapeString(info.shape), ", expected ",
                                                     ShapeString(part.shape)));
    }
    const bool ok_dtype =
        part.packed ? info.dtype == SafetensorsDtype::kU8 : IsFloatDtype(info.dtype);
    if (!ok_dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", part.name, "': dtype ", std::string(SafetensorsDtypeName(info.dtype)),
          ", expected ", part.packed ? "U8" : "F32, BF16 or F16"));
    }
  }
  return absl::OkStatus();
}

// Reads a checked form into a fresh fp32 tensor of the parameter's shape.
absl::StatusOr<at::Tensor> ReadForm(const SafetensorsModel& model, const ParamSpec& p,
                                    const Form& form) {
  at::Tensor out = at::empty(p.shape, at::kFloat);
  if (form.mxfp4) {
    const std::vector<int64_t>& bshape = form.parts[0].shape;  // [E, R, G, 16]
    MEGATRAIN_ASSIGN_OR_RETURN(auto blocks, model.Find(form.parts[0].name));
    MEGATRAIN_ASSIGN_OR_RETURN(auto scales, model.Find(form.parts[1].name));
    at::Tensor decoded =
        at::empty({bshape[0], bshape[1], bshape[2] * kMxfp4BlockElements}, at::kFloat);
    MEGATRAIN_RETURN_IF_ERROR(DequantizeMxfp4(
        p.hf_name, blocks.file->Data(*blocks.info), scales.file->Data(*scales.info),
        absl::Span<float>(decoded.data_ptr<float>(), static_cast<size_t>(decoded.numel()))));
    out.copy_(decoded.transpose(1, 2));
    return out;
  }
  float* dst = out.data_ptr<float>();
  for (const DiskPart& part : form.parts) {
    const int64_t n = Numel(part.shape);
    MEGATRAIN_RETURN_IF_ERROR(model.ReadAsFloat32(part.name, dst, n));
    dst += n;
  }
  return out;
}

}  // namespace

absl::StatusOr<MoeTensorMap> LoadMoeHfParams(const MoeModelConfig& config,
                                             const SafetensorsModel& model) {
  // The layer of each parameter (-1 outside layers), for its forms.
  std::vector<std::pair<ParamSpec, int64_t>> params;
  for (ParamSpec& p : MoeModelParams(config)) {
    const int64_t layer_idx = LayerOf(p.hf_name);
    params.emplace_back(std::move(p), layer_idx);
  }
  // Phase 1: every tensor on disk belongs to some form of some parameter.
  std::vector<std::vector<Form>> forms;
  std::set<std::string> claimable;
  for (const auto& [p, layer_idx] : params) {
    forms.push_back(FormsOf(config, p, layer_idx));
    for (const Form& f : forms.back()) {
      for (const DiskPart& part : f.parts) claimable.insert(part.name);
    }
  }
  for (const std::string& name : model.TensorNames()) {
    if (claimable.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "' is not a parameter of this ", config.moe.model_type, " model"));
    }
  }
  // Phase 2: one complete, well-shaped form per parameter.
  std::vector<const Form*> chosen;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i].first;
    const Form* found = nullptr;
    for (const Form& f : forms[i]) {
      bool any = false;
      for (const DiskPart& part : f.parts) any = any || model.Contains(part.name);
      if (!any) continue;
      if (found != nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter '", p.hf_name, "' is stored twice: as '", found->parts[0].name,
                         "' and as '", f.parts[0].name, "'"));
      }
      found = &f;
    }
    if (found == nullptr) {
      return absl::NotFoundError(absl::StrCat("tensor '", p.hf_name, "' missing"));
    }
    MEGATRAIN_RETURN_IF_ERROR(CheckForm(model, p, *found));
    chosen.push_back(found);
  }
  // Phase 3: convert.
  MoeTensorMap out;
  for (size_t i = 0; i < params.size(); ++i) {
    MEGATRAIN_ASSIGN_OR_RETURN(at::Tensor t, ReadForm(model, params[i].first, *chosen[i]));
    out[params[i].first.hf_name] = std::move(t);
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> ExportMoeHfTensors(
    const MoeModelConfig& config, const MoeTensorMap& params, MoeExportFormat format) {
  const MoeConfig& m = config.moe;
  const bool per_expert = format == MoeExportFormat::kCheckpoint && PerExpertOnDisk(m);
  const int64_t fe = m.moe_intermediate_size;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const ParamSpec& p : MoeModelParams(config)) {
    auto it = params.find(p.hf_name);
    if (it == params.end()) {
      return absl::NotFoundError(absl::StrCat("parameter '", p.hf_name, "' missing"));
    }
    at::Tensor t = it->second.detach().to(at::kCPU, at::kFloat).contiguous();
    if (t.sizes().vec() != p.shape) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.hf_name, "': shape ",
                                                     ShapeString(t.sizes().vec()), ", expected ",
                                                     ShapeString(p.shape)));
    }
    const int64_t layer_idx = LayerOf(p.hf_name);
    const std::string local =
        layer_idx < 0 ? p.hf_name
                      : p.hf_name.substr(absl::StrCat("model.layers.", layer_idx, ".").size());
    if (per_expert && local == "mlp.experts.gate_up_proj") {
      for (int64_t e = 0; e < m.num_experts; ++e) {
        auto names = PerExpertNames(m, layer_idx, e);
        out.emplace_back(names[0], t[e].narrow(0, 0, fe).contiguous());
        out.emplace_back(names[1], t[e].narrow(0, fe, fe).contiguous());
      }
    } else if (per_expert && local == "mlp.experts.down_proj") {
      for (int64_t e = 0; e < m.num_experts; ++e) {
        out.emplace_back(PerExpertNames(m, layer_idx, e)[2], t[e].contiguous());
      }
    } else if (per_expert && m.family == MoeFamily::kMixtral && local == "mlp.gate.weight") {
      out.emplace_back(absl::StrCat("model.layers.", layer_idx, ".block_sparse_moe.gate.weight"),
                       t);
    } else {
      out.emplace_back(p.hf_name, t);
    }
  }
  return out;
}

absl::Status WriteMoeSafetensors(const std::string& path, const MoeModelConfig& config,
                                 const MoeTensorMap& params, MoeExportFormat format,
                                 SafetensorsDtype dtype) {
  MEGATRAIN_ASSIGN_OR_RETURN(auto tensors, ExportMoeHfTensors(config, params, format));
  MEGATRAIN_ASSIGN_OR_RETURN(SafetensorsWriter writer, SafetensorsWriter::Create(path));
  MEGATRAIN_RETURN_IF_ERROR(writer.SetMetadata("format", "pt"));
  for (auto& [name, t] : tensors) {
    MEGATRAIN_RETURN_IF_ERROR(writer.AddFloat32(name, dtype, t.sizes().vec(), t.data_ptr<float>()));
  }
  return writer.Finish();
}

}  // namespace megatrain::engine
