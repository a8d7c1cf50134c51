// SPDX-License-Identifier: MIT
// The `gdn` executable: everything is in gdn::cli::main (cli.cpp), testable in-process.
#include <iostream>
#include <string>
#include <vector>

#include "cli/cli.hpp"

int main(int argc, char** argv) {
  return gdn::cli::main(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
