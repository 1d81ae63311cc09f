// File: tools/cli/help_text.cc

#include "help_text.h"

#include <algorithm>
#include <sstream>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace leasehold::cli {

namespace {

bool StartsWith(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

// The text between `before` and `after` in `text` (after: "" for the rest), or "".
std::string Between(std::string_view text, std::string_view before, std::string_view after) {
  const std::size_t start = text.find(before);
  if (start == std::string_view::npos) {
    return "";
  }
  std::string_view rest = text.substr(start + before.size());
  const std::size_t end = after.empty() ? std::string_view::npos : rest.find(after);
  return std::string(rest.substr(0, end));
}

// Levenshtein distance, for "did you mean".
std::size_t Distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) {
    row[j] = j;
  }
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::vector<std::string> SubcommandNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names.push_back(sub->get_name());
  }
  return names;
}

// The closest of `names` to `word` if it is a likely typo of it, else "".
std::string Closest(std::string_view word, const std::vector<std::string>& names) {
  std::string best;
  std::size_t best_distance = 3;  // more than two edits is not a typo
  for (const std::string& name : names) {
    const std::size_t d = Distance(word, name);
    if (d < best_distance) {
      best = name;
      best_distance = d;
    }
  }
  return best;
}

// The first argument that is not an option (nor an option's value we cannot tell apart: only
// the common options take one, --store).
std::string FirstWord(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg(argv[i]);
    if (arg == "--store") {
      ++i;
      continue;
    }
    if (!StartsWith(arg, "-")) {
      return std::string(arg);
    }
  }
  return "";
}

// "run" for `leasehold run ...`, "" before a subcommand was found.
std::string ParsedSubcommand(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) {
    return sub->get_name();
  }
  return "";
}

std::string Joined(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) {
    out += (out.empty() ? "" : ", ") + w;
  }
  return out;
}

std::string Describe(const CLI::ParseError& error, const CLI::App& app, int argc, char** argv,
                     const std::string& sub) {
  const std::string what = error.what();
  const std::vector<std::string> subcommands = SubcommandNames(app);
  if (sub.empty() && (dynamic_cast<const CLI::RequiredError*>(&error) != nullptr ||
                      dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr)) {
    const std::string word = FirstWord(argc, argv);
    if (word.empty()) {
      return fmt::format("no subcommand: give one of {}", Joined(subcommands));
    }
    const std::string closest = Closest(word, subcommands);
    return fmt::format("unknown subcommand '{}'{}; the subcommands are {}", word,
                       closest.empty() ? "" : fmt::format(" (did you mean '{}'?)", closest),
                       Joined(subcommands));
  }
  const std::string in = sub.empty() ? std::string() : sub + ": ";
  if (dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr) {
    std::string extras = Between(what, "expected: ", "");
    if (StartsWith(extras, "-")) {
      return fmt::format("{}unknown option {}", in, extras);
    }
    return fmt::format("{}unexpected argument{} {}{}", in,
                       extras.find(' ') == std::string::npos ? "" : "s", extras,
                       sub == "run" || sub == "elect" ? " (the command to run goes after --)" : "");
  }
  if (dynamic_cast<const CLI::RequiredError*>(&error) != nullptr) {
    if (StartsWith(what, "--key is required")) {
      return fmt::format("{}missing KEY (give it as KEY, or as --key KEY if it starts with '-')",
                         in);
    }
    if (what.find("At Most") != std::string::npos || what.find("at most") != std::string::npos) {
      return fmt::format("{}one subcommand at a time: {}", in, Joined(subcommands));
    }
    return fmt::format("{}missing {}", in, Between(what, "", " is required"));
  }
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&error) != nullptr) {
    const std::string flag = Between(what, "", ":");
    const std::string type = Between(what, " required ", " missing");
    if (!type.empty()) {
      return fmt::format("{}{} needs a value ({})", in, flag, type);
    }
    return fmt::format("{}{} takes {}", in, flag, Between(what, ": ", ""));
  }
  if (dynamic_cast<const CLI::ValidationError*>(&error) != nullptr ||
      dynamic_cast<const CLI::ConversionError*>(&error) != nullptr) {
    const std::string flag = Between(what, "", ":");
    if (what.find(" not in range ") != std::string::npos) {
      return fmt::format("{}{} takes a whole number from {}, not '{}'", in, flag,
                         Between(what, " not in range ", ""), Between(what, "Value ", " not in"));
    }
    if (what.find(" not in {") != std::string::npos) {
      std::string choices = Between(what, "{", "}");
      std::replace(choices.begin(), choices.end(), ',', '|');
      return fmt::format("{}{} takes one of {}, not '{}'", in, flag, choices,
                         Between(what, ": ", " not in {"));
    }
    return fmt::format("{}{}", in, what);
  }
  if (dynamic_cast<const CLI::ExcludesError*>(&error) != nullptr) {
    return fmt::format("{}{} and {} cannot be given together", in, Between(what, "", " excludes "),
                       Between(what, " excludes ", ""));
  }
  return fmt::format("{}{}", in, what);
}

}  // namespace

std::string Wrap(const std::string& text, std::size_t width) {
  std::string out;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    std::size_t newline = text.find('\n', begin);
    if (newline == std::string::npos) {
      newline = text.size();
    }
    std::string_view line(text.data() + begin, newline - begin);
    // A line that fits is kept as it is (a table's alignment too); a longer one is broken at
    // its last space within the width.
    while (line.size() > width) {
      std::size_t cut = line.rfind(' ', width);
      if (cut == std::string_view::npos || cut == 0) {
        cut = line.find(' ', width);
        if (cut == std::string_view::npos) {
          break;
        }
      }
      out.append(line.substr(0, cut));
      out += '\n';
      line.remove_prefix(cut + 1);
    }
    out.append(line);
    if (newline < text.size()) {
      out += '\n';
    }
    begin = newline + 1;
  }
  return out;
}

std::string WrappingFormatter::make_option_desc(const CLI::Option* opt) const {
  return Wrap(CLI::Formatter::make_option_desc(opt), kHelpWidth - get_column_width());
}

std::string WrappingFormatter::make_description(const CLI::App* app) const {
  return Wrap(CLI::Formatter::make_description(app), kHelpWidth);
}

std::string WrappingFormatter::make_footer(const CLI::App* app) const {
  return Wrap(CLI::Formatter::make_footer(app), kHelpWidth);
}

std::string WrappingFormatter::make_subcommand(const CLI::App* sub) const {
  std::stringstream out;
  CLI::detail::format_help(out, sub->get_display_name(true),
                           Wrap(sub->get_description(), kHelpWidth - get_column_width()),
                           get_column_width());
  return out.str();
}

std::string ParseErrorText(const CLI::ParseError& error, const CLI::App& app, int argc,
                           char** argv) {
  const std::string sub = ParsedSubcommand(app);
  return fmt::format("{} (see 'leasehold {}--help')", Describe(error, app, argc, argv, sub),
                     sub.empty() ? "" : sub + " ");
}

}  // namespace leasehold::cli
