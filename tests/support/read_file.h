// Reading test inputs: a file's text, and the IR examples in examples/ir/
// (test targets define MODELPAR_SOURCE_DIR).
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace modelpar::testing {

/// The whole text of `path`; records a test failure (and returns "") when it
/// cannot be opened.
inline std::string readFile(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) {
    ADD_FAILURE() << "cannot open " << path;
    return "";
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

#ifdef MODELPAR_SOURCE_DIR
/// The text of examples/ir/<name>.
inline std::string readExample(const std::string& name) {
  return readFile(std::string(MODELPAR_SOURCE_DIR) + "/examples/ir/" + name);
}
#endif

}  // namespace modelpar::testing
