// File: tools/cli/help_text.h
//
// The command's help and parse errors in leasehold's own words rather than CLI11's: help text
// wrapped to 100 columns (options, descriptions and footers), and every parse failure (an
// unknown or missing subcommand, an unexpected argument, a missing value, a value out of range)
// as one line that names the flag and what it takes.
//
// Example:
//
//   app.formatter(std::make_shared<WrappingFormatter>());
//   catch (const CLI::ParseError& e) { Error(ParseErrorText(e, app, argc, argv)); }
//
// Thread safety: no shared state.

#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace leasehold::cli {

// The width help text is wrapped to.
inline constexpr std::size_t kHelpWidth = 100;

// Wraps `text` at spaces to lines of at most `width` characters (a longer word stays whole);
// existing newlines are kept.
std::string Wrap(const std::string& text, std::size_t width);

// CLI11's formatter with option descriptions, the command's description and its footer wrapped
// to kHelpWidth columns.
class WrappingFormatter : public CLI::Formatter {
 public:
  WrappingFormatter() { column_width(30); }

  std::string make_option_desc(const CLI::Option* opt) const override;
  std::string make_description(const CLI::App* app) const override;
  std::string make_footer(const CLI::App* app) const override;
  std::string make_subcommand(const CLI::App* sub) const override;
};

// One line for a failed parse of argv by `app`, naming the subcommand and the flag:
// "unknown subcommand 'runn' (did you mean 'run'?)", "run: --limit takes a whole number from 1
// to 1024, not '0'", ..., ending with where to read more ("see 'leasehold run --help'").
std::string ParseErrorText(const CLI::ParseError& error, const CLI::App& app, int argc,
                           char** argv);

}  // namespace leasehold::cli
