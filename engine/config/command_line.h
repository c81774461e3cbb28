// engine/config/command_line.h: the command line shared by Retort's programs:
// `PROGRAM CONFIG.yaml [key=value ...] [options]`. The caller declares its own options; the
// config path and the overrides are positional. A parse error is a UserError.
#pragma once
#include <boost/program_options.hpp>
#include <string>
#include <vector>

namespace retort::engine {

struct ConfigCommandLine {
  boost::program_options::variables_map options;
  std::string config;                  // empty when not given
  std::vector<std::string> overrides;  // key=value, in order
};

ConfigCommandLine parse_config_command_line(
    int argc, char** argv, const boost::program_options::options_description& options);

}  // namespace retort::engine
