// megatrain: the MegaTrain command-line client. See client/cli.h.
//
// `megatrain [global flags] tokenize ...` runs locally, without a daemon:
// it executes the `megatrain-tokenize` program installed beside this one
// (the tokenizer lives in the engine, which this client does not link).
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "client/cli.h"

namespace {

int RunTokenize(const std::vector<std::string>& arguments) {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::vector<std::filesystem::path> candidates;
  if (!ec) {
    candidates.push_back(self.parent_path() / "megatrain-tokenize");
    candidates.push_back(self.parent_path() / ".." / "engine" /
                         "megatrain-tokenize");  // build tree
  }
  for (const auto& path : candidates) {
    if (!std::filesystem::exists(path)) continue;
    std::vector<std::string> owned = arguments;
    std::vector<char*> args;
    std::string program = path.string();
    args.push_back(program.data());
    for (std::string& arg : owned) args.push_back(arg.data());
    args.push_back(nullptr);
    execv(program.c_str(), args.data());
    std::cerr << "megatrain tokenize: cannot run " << program << ": " << std::strerror(errno)
              << "\n";
    return 1;
  }
  std::cerr << "megatrain tokenize: megatrain-tokenize not found beside " << self << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (auto arguments = megatrain::client::TokenizeArguments(argc, argv)) {
    return RunTokenize(*arguments);
  }
  return megatrain::client::RunCli(argc, argv, std::cout, std::cerr, isatty(STDOUT_FILENO) == 1);
}
