# megatrain_spec: the job-spec library (engine/spec/job_spec.h): spec types,
# validation, JSON and MaxSteps, without LibTorch, so that the server links
# it too (it stores, converts and admits specs). Validation checks presets,
# hence megatrain_model_config (engine/model/model_config.cc and the MoE
# part it parses, moe_config.cc, with the parameter layouts it counts:
# param_layout.cc, moe_layout.cc; all torch-free).
# Included by engine/CMakeLists.txt and, in a build without the engine, by
# server/CMakeLists.txt: the guard declares the targets once.
include_guard(GLOBAL)

megatrain_cc_library(
  NAME megatrain_model_config
  SRCS ${PROJECT_SOURCE_DIR}/engine/model/model_config.cc
       ${PROJECT_SOURCE_DIR}/engine/model/moe_config.cc
       ${PROJECT_SOURCE_DIR}/engine/model/param_layout.cc
       ${PROJECT_SOURCE_DIR}/engine/model/moe_layout.cc
  DEPS absl::status absl::statusor absl::strings nlohmann_json::nlohmann_json
  FORBID "torch" "grpc" "protobuf" "prometheus")

megatrain_cc_library(
  NAME megatrain_spec
  SRCS ${PROJECT_SOURCE_DIR}/engine/spec/job_spec.cc
       ${PROJECT_SOURCE_DIR}/engine/spec/job_spec_json.cc
  DEPS megatrain_model_config absl::status absl::statusor absl::strings
       nlohmann_json::nlohmann_json
  FORBID "torch" "grpc" "protobuf" "prometheus")
