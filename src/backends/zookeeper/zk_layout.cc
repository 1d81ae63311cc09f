// File: backends/zookeeper/zk_layout.cc (internal)
//
// Node names and node data of the zk:// store. See zk_layout.h.

#include "backends/zookeeper/zk_layout.h"

#include <algorithm>
#include <charconv>
#include <chrono>

#include <fmt/format.h>

namespace leasehold::internal::zk_layout {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

std::string EscapeKey(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (unsigned char c : key) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
        c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

std::optional<std::string> UnescapeKey(std::string_view name) {
  std::string out;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name[i] != '%') {
      out.push_back(name[i]);
      continue;
    }
    if (i + 2 >= name.size()) {
      return std::nullopt;
    }
    unsigned value = 0;
    auto [end, ec] = std::from_chars(name.data() + i + 1, name.data() + i + 3, value, 16);
    if (ec != std::errc() || end != name.data() + i + 3) {
      return std::nullopt;
    }
    out.push_back(static_cast<char>(value));
    i += 2;
  }
  return out;
}

std::int64_t SequenceOf(std::string_view name) {
  std::size_t dash = name.rfind('-');
  if (dash == std::string_view::npos) {
    return -1;
  }
  std::int64_t seq = -1;
  auto [end, ec] = std::from_chars(name.data() + dash + 1, name.data() + name.size(), seq);
  if (ec != std::errc() || end != name.data() + name.size()) {
    return -1;
  }
  return seq;
}

void SortBySequence(std::vector<std::string>& children) {
  std::erase_if(children, [](const std::string& n) { return SequenceOf(n) < 0; });
  std::sort(children.begin(), children.end(), [](const std::string& a, const std::string& b) {
    std::int64_t sa = SequenceOf(a);
    std::int64_t sb = SequenceOf(b);
    return sa != sb ? sa < sb : a < b;
  });
}

std::string NodeData(Duration ttl, std::string_view owner_token, std::string_view holder) {
  return fmt::format("{}\n{}\n{}", duration_cast<milliseconds>(ttl).count(),
                     owner_token.substr(0, 8), holder);
}

LeaseInfo ParseNodeData(std::string_view key, std::string_view data, FencingToken czxid) {
  LeaseInfo info;
  info.key = std::string(key);
  info.fencing_token = czxid;
  std::size_t first = data.find('\n');
  std::size_t second = first == std::string_view::npos ? first : data.find('\n', first + 1);
  if (second != std::string_view::npos) {
    std::int64_t ms = 0;
    std::from_chars(data.data(), data.data() + first, ms);
    info.ttl = milliseconds(ms);
    info.remaining = info.ttl;
    info.token_prefix = std::string(data.substr(first + 1, second - first - 1));
    info.holder = std::string(data.substr(second + 1));
  }
  return info;
}

// The kept grant (Backend::Finish with keep > 0). Its name has no '-', so SortBySequence never
// takes it for a queued node.
std::string KeptData(Duration keep, FencingToken fencing, std::string_view owner_token,
                     std::string_view holder) {
  return fmt::format("kept1\n{}\n{}\n{}\n{}", duration_cast<milliseconds>(keep).count(), fencing,
                     owner_token.substr(0, 8), holder);
}

bool TakeNumber(std::string_view& text, std::int64_t* value) {
  std::size_t nl = text.find('\n');
  if (nl == std::string_view::npos) {
    return false;
  }
  auto [end, ec] = std::from_chars(text.data(), text.data() + nl, *value);
  if (ec != std::errc() || end != text.data() + nl) {
    return false;
  }
  text.remove_prefix(nl + 1);
  return true;
}

std::optional<LeaseInfo> ParseKeptData(std::string_view key, std::string_view data) {
  constexpr std::string_view kMagic = "kept1\n";
  if (!data.starts_with(kMagic)) {
    return std::nullopt;
  }
  data.remove_prefix(kMagic.size());
  std::int64_t keep_ms = 0;
  std::int64_t fencing = 0;
  std::size_t nl = 0;
  if (!TakeNumber(data, &keep_ms) || !TakeNumber(data, &fencing) ||
      (nl = data.find('\n')) == std::string_view::npos) {
    return std::nullopt;
  }
  LeaseInfo info;
  info.key = std::string(key);
  info.ttl = milliseconds(keep_ms);
  info.fencing_token = static_cast<FencingToken>(fencing);
  info.token_prefix = std::string(data.substr(0, nl));
  info.holder = std::string(data.substr(nl + 1));
  return info;
}

std::string RecordData(Duration ttl, std::string_view record) {
  return fmt::format("{}\n{}", duration_cast<milliseconds>(ttl).count(), record);
}

SystemTime FromZkMillis(std::int64_t ms) {
  return SystemTime(duration_cast<SystemTime::duration>(milliseconds(ms)));
}

// Children come in no particular order, and escaped names would not sort as the keys do ("%2E"
// for '.' sorts before '-'): decode, filter and sort the keys themselves.
std::vector<std::string> KeysWithPrefix(const std::vector<std::string>& names,
                                        std::string_view prefix) {
  std::vector<std::string> keys;
  for (const std::string& name : names) {
    std::optional<std::string> key = UnescapeKey(name);
    if (key.has_value() && key->starts_with(prefix)) {
      keys.push_back(std::move(*key));
    }
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

}  // namespace leasehold::internal::zk_layout
