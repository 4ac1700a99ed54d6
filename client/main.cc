// megatrain: the MegaTrain command-line client. See client/cli.h.
#include <unistd.h>

#include <iostream>

#include "client/cli.h"

int main(int argc, char** argv) {
  return megatrain::client::RunCli(argc, argv, std::cout, std::cerr, isatty(STDOUT_FILENO) == 1);
}
