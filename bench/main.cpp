// SPDX-License-Identifier: MIT
#include <iostream>

#include "bench.hpp"

int main(int argc, char** argv) {
  return gdn::bench::main(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
