// modelpar._C.run_passes / registered_passes: named passes on IR text
// (passes/pass_registry.h), for `python -m modelpar opt`. Only pybind11 and
// passes/ here: no PyTorch header, so it compiles in seconds.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#ifdef MODELPAR_HAS_PASSES
#include "passes/passes.h"
#endif

namespace py = pybind11;

namespace modelpar {

#ifdef MODELPAR_HAS_PASSES
void bindPasses(py::module_& m) {
  m.def(
      "run_passes",
      [](const std::string& text, const std::vector<std::string>& specs,
         std::optional<std::string> dump_dir, bool verify) {
        std::vector<passes::PassSpec> parsed;
        for (const std::string& s : specs) parsed.push_back(passes::parsePassSpec(s));
        passes::PassRunnerOptions o;
        o.dump_dir = std::move(dump_dir);
        o.verify = verify;
        passes::IrUnit ir = passes::parseIrUnit(text);
        py::gil_scoped_release release;
        return passes::printIrUnit(passes::runPasses(std::move(ir), parsed, o));
      },
      py::arg("text"), py::arg("passes"), py::arg("dump_dir") = py::none(),
      py::arg("verify") = true,
      "Runs named passes (NAME or NAME:key=value,...) on IR text; returns the IR text they leave.");
  m.def(
      "option_names",
      [] {
        py::dict out;
        for (const passes::OptionValues& o : passes::optionValues()) {
          out[py::str(std::string(o.option))] =
              std::vector<std::string>(o.values.begin(), o.values.end());
        }
        out["max_devices"] = passes::kMaxDevices;
        return out;
      },
      "The planning options' valid values (passes/option_names.h), and max_devices.");
  m.def(
      "check_option",
      [](const std::string& who, const std::string& option, const std::string& value) {
        for (const passes::OptionValues& o : passes::optionValues()) {
          if (o.option == option) return passes::checkOneOf(who, option, value, o.values);
        }
        throw py::key_error(option);
      },
      py::arg("who"), py::arg("option"), py::arg("value"),
      "ConfigError (the message passes/ gives) unless `value` is valid for `option`.");
  m.def("registered_passes", [] {
    std::vector<std::tuple<std::string, std::string, std::string>> out;
    for (const passes::RegisteredPass& p : passes::registeredPasses()) {
      out.emplace_back(std::string(p.name), std::string(p.reads), std::string(p.help));
    }
    return out;
  });
}
#else
void bindPasses(py::module_& /*m*/) {}
#endif

}  // namespace modelpar
