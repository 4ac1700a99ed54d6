# megatrain_fs: the file-system floor (engine/fs/): DirFd (Note [Directory
# descriptors] in dir_fd.h), MappedFile and AtomicFileWriter (mapped_file.h),
# HeldOutputDir (held_output_dir.h). No LibTorch, so that the server links it
# too. Included by engine/CMakeLists.txt and, in a build without the engine,
# by server/CMakeLists.txt: the guard declares the target once.
include_guard(GLOBAL)

megatrain_cc_library(
  NAME megatrain_fs
  SRCS ${PROJECT_SOURCE_DIR}/engine/fs/dir_fd.cc
       ${PROJECT_SOURCE_DIR}/engine/fs/mapped_file.cc
       ${PROJECT_SOURCE_DIR}/engine/fs/held_output_dir.cc
  DEPS absl::status absl::statusor absl::strings absl::str_format
  FORBID "torch" "grpc" "protobuf" "prometheus")
