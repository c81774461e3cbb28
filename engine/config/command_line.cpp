// engine/config/command_line.cpp: see command_line.h.
#include "engine/config/command_line.h"

#include "common/user_error.h"

namespace retort::engine {

ConfigCommandLine parse_config_command_line(
    int argc, char** argv, const boost::program_options::options_description& options) {
  namespace po = boost::program_options;
  po::options_description positional_options;
  positional_options.add_options()("config", po::value<std::string>(), "")(
      "overrides", po::value<std::vector<std::string>>()->default_value({}, ""), "");
  po::options_description all;
  all.add(options).add(positional_options);
  po::positional_options_description positional;
  positional.add("config", 1).add("overrides", -1);
  ConfigCommandLine line;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(positional).run(),
              line.options);
    po::notify(line.options);
  } catch (const po::error& e) {
    throw UserError(std::string("command line: ") + e.what() + " (see --help)");
  }
  if (line.options.count("config")) line.config = line.options["config"].as<std::string>();
  line.overrides = line.options["overrides"].as<std::vector<std::string>>();
  return line;
}

}  // namespace retort::engine
