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

namespace {

// The longest TTL read from a node: half of Duration's range (~146 years), so that it converts
// to nanoseconds (LeaseInfo users print it with FormatDuration) and adds to a node's mtime
// without overflow. Any client with access to the chroot may have written the node.
constexpr std::int64_t kMaxTtlMs =
    std::chrono::duration_cast<milliseconds>(Duration::max()).count() / 2;

// True for the bytes EscapeKey keeps as they are.
bool KeptAsIs(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

int UpperHexValue(char c) {
  if (c >= '0' && c <= '9') {
    return c - '0';
  }
  if (c >= 'A' && c <= 'F') {
    return c - 'A' + 10;
  }
  return -1;
}

}  // namespace

std::string EscapeKey(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (unsigned char c : key) {
    if (KeptAsIs(c)) {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

std::optional<std::string> UnescapeKey(std::string_view name) {
  // Only what EscapeKey writes: one name per key. "%41" or a literal '.' would be a second
  // name for "A" or a key with '.', which List would show twice and no grant would use.
  std::string out;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name[i] != '%') {
      if (!KeptAsIs(static_cast<unsigned char>(name[i]))) {
        return std::nullopt;
      }
      out.push_back(name[i]);
      continue;
    }
    if (i + 2 >= name.size()) {
      return std::nullopt;
    }
    const int hi = UpperHexValue(name[i + 1]);
    const int lo = UpperHexValue(name[i + 2]);
    if (hi < 0 || lo < 0 || KeptAsIs(static_cast<unsigned char>(hi * 16 + lo))) {
      return std::nullopt;
    }
    out.push_back(static_cast<char>(hi * 16 + lo));
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

namespace {

// Reads a decimal number of at most `max` (no sign, no leading zero) from the whole of `text`.
std::optional<std::uint32_t> ReadSmallNumber(std::string_view text, std::uint32_t max) {
  if (text.empty() || (text.size() > 1 && text.front() == '0')) {
    return std::nullopt;
  }
  std::uint32_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n > max) {
    return std::nullopt;
  }
  return n;
}

// The highest slot read from a node: a shared key's slots are not bounded by a limit, but no
// more grants than this can be live (ZooKeeper would be out of memory first).
constexpr std::uint32_t kMaxSlot = 1U << 30;

// The kind a tag names (without its leading '.'); nullopt for an unknown one.
std::optional<NodeKind> KindOfTag(std::string_view tag) {
  if (tag == "s") {
    return NodeKind{.mode = LeaseMode::kShared, .limit = 1};
  }
  if (tag.starts_with('n')) {
    std::optional<std::uint32_t> n = ReadSmallNumber(tag.substr(1), kMaxLeaseLimit);
    if (n.has_value() && *n > 1) {
      return NodeKind{.mode = LeaseMode::kExclusive, .limit = *n};
    }
  }
  return std::nullopt;
}

}  // namespace

std::string KindTag(NodeKind kind) {
  if (kind.limit > 1) {
    return fmt::format(".n{}", kind.limit);
  }
  return kind.mode == LeaseMode::kShared ? ".s" : "";
}

NodeKind KindOfNode(std::string_view name) {
  const std::size_t dash = name.rfind('-');
  const std::string_view id = name.substr(0, dash == std::string_view::npos ? 0 : dash);
  const std::size_t dot = id.rfind('.');
  if (dot == std::string_view::npos) {
    return NodeKind{};
  }
  return KindOfTag(id.substr(dot + 1)).value_or(NodeKind{});
}

std::string KeptName(NodeKind kind, std::uint32_t slot) {
  if (kind == NodeKind{}) {
    return std::string(kKeptName);
  }
  return fmt::format("{}{}.{}", kKeptName, KindTag(kind), slot);
}

std::optional<KeptSlot> ParseKeptName(std::string_view name) {
  if (name == kKeptName) {
    return KeptSlot{};
  }
  if (!name.starts_with(kKeptName) || name.size() <= kKeptName.size() ||
      name[kKeptName.size()] != '.') {
    return std::nullopt;
  }
  std::string_view rest = name.substr(kKeptName.size() + 1);
  const std::size_t dot = rest.find('.');
  if (dot == std::string_view::npos) {
    return std::nullopt;
  }
  std::optional<NodeKind> kind = KindOfTag(rest.substr(0, dot));
  std::optional<std::uint32_t> slot = ReadSmallNumber(rest.substr(dot + 1), kMaxSlot);
  if (!kind.has_value() || !slot.has_value()) {
    return std::nullopt;
  }
  return KeptSlot{.kind = *kind, .slot = *slot};
}

std::string NodeData(Duration ttl, std::string_view owner_token, std::string_view holder,
                     std::optional<std::uint32_t> slot) {
  const std::int64_t ms = duration_cast<milliseconds>(ttl).count();
  if (slot.has_value()) {
    return fmt::format("{} {}\n{}\n{}", ms, *slot, owner_token.substr(0, 8), holder);
  }
  return fmt::format("{}\n{}\n{}", ms, owner_token.substr(0, 8), holder);
}

std::optional<std::uint32_t> SlotOfNodeData(std::string_view data) {
  const std::string_view first = data.substr(0, data.find('\n'));
  const std::size_t space = first.find(' ');
  if (space == std::string_view::npos) {
    return std::nullopt;
  }
  return ReadSmallNumber(first.substr(space + 1), kMaxSlot);
}

LeaseInfo ParseNode(std::string_view key, std::string_view name, std::string_view data,
                    FencingToken czxid) {
  LeaseInfo info = ParseNodeData(key, data, czxid);
  const NodeKind kind = KindOfNode(name);
  info.mode = kind.mode;
  info.limit = kind.limit;
  info.slot = SlotOfNodeData(data).value_or(0);
  return info;
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
    // Any client with access may have written the node: a TTL out of range is as unknown as
    // an unreadable one.
    info.ttl = milliseconds(ms >= 0 && ms <= kMaxTtlMs ? ms : 0);
    // The session's last heartbeat is the server's alone: the TTL is all that can be said.
    info.remaining = info.ttl;
    info.remaining_is_upper_bound = true;
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
  // Not ours either: a keep out of range, or a negative fencing token (tokens are czxids, > 0;
  // cast to unsigned, "-3" would read as a token near 2^64).
  if (!TakeNumber(data, &keep_ms) || !TakeNumber(data, &fencing) || keep_ms < 0 ||
      keep_ms > kMaxTtlMs || fencing < 0 || (nl = data.find('\n')) == std::string_view::npos) {
    return std::nullopt;
  }
  LeaseInfo info;
  info.key = std::string(key);
  info.ttl = milliseconds(keep_ms);
  info.fencing_token = static_cast<FencingToken>(fencing);
  info.token_prefix = std::string(data.substr(0, nl));
  info.holder = std::string(data.substr(nl + 1));
  info.kept = true;
  return info;
}

std::string RecordData(Duration ttl, std::string_view record) {
  return fmt::format("{}\n{}", duration_cast<milliseconds>(ttl).count(), record);
}

std::optional<RecordNode> ParseRecordData(std::string_view data) {
  std::int64_t ttl_ms = 0;
  if (!TakeNumber(data, &ttl_ms) || ttl_ms < 0 || ttl_ms > kMaxTtlMs) {
    return std::nullopt;
  }
  return RecordNode{.ttl = milliseconds(ttl_ms), .record = data};
}

SystemTime FromZkMillis(std::int64_t ms) {
  return SystemTime(duration_cast<SystemTime::duration>(milliseconds(ms)));
}

namespace {

// True if `path` is `node` or below it.
bool AtOrBelow(std::string_view path, std::string_view node) {
  return path.starts_with(node) && (path.size() == node.size() || path[node.size()] == '/');
}

// Decodes the UTF-8 character at text[*i], advancing *i; -1 if the bytes there are not UTF-8
// (truncated, overlong, a stray continuation byte, a surrogate's encoding, past U+10FFFF).
std::int32_t NextCodePoint(std::string_view text, std::size_t* i) {
  const auto byte = [&](std::size_t at) { return static_cast<unsigned char>(text[at]); };
  const unsigned char lead = byte(*i);
  int extra = 0;
  std::int32_t cp = 0;
  if (lead < 0x80) {
    ++*i;
    return lead;
  }
  if (lead >= 0xC2 && lead <= 0xDF) {
    extra = 1;
    cp = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    extra = 2;
    cp = lead & 0x0F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    extra = 3;
    cp = lead & 0x07;
  } else {
    return -1;
  }
  if (*i + static_cast<std::size_t>(extra) >= text.size()) {
    return -1;
  }
  for (int k = 1; k <= extra; ++k) {
    const unsigned char c = byte(*i + k);
    if ((c & 0xC0) != 0x80) {
      return -1;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  constexpr std::int32_t kMin[] = {0, 0x80, 0x800, 0x10000};  // overlong below these
  if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    return -1;
  }
  *i += static_cast<std::size_t>(extra) + 1;
  return cp;
}

}  // namespace

std::string DataPathProblem(std::string_view chroot, std::string_view path) {
  if (!path.starts_with('/')) {
    return "a ZooKeeper node path must be absolute (start with '/')";
  }
  if (path == "/") {
    return "\"/\" is the store's root node (the chroot), which holds leasehold's own nodes";
  }
  if (path.ends_with('/')) {
    return "a ZooKeeper node path must not end with '/'";
  }
  std::size_t start = 1;
  while (start <= path.size()) {
    std::size_t end = path.find('/', start);
    if (end == std::string_view::npos) {
      end = path.size();
    }
    const std::string_view component = path.substr(start, end - start);
    if (component.empty()) {
      return "a ZooKeeper node path has no empty components (\"//\")";
    }
    if (component == "." || component == "..") {
      return "a ZooKeeper node path has no \".\" or \"..\" components";
    }
    start = end + 1;
  }
  for (std::size_t i = 0; i < path.size();) {
    const std::int32_t cp = NextCodePoint(path, &i);
    if (cp < 0) {
      return "ZooKeeper node paths are UTF-8";
    }
    // ZooKeeper's PathUtils.validatePath, on the Java (UTF-16) characters of the path: a
    // character outside the BMP is a surrogate pair there, refused as U+D800..U+DFFF.
    if (cp <= 0x1F || (cp >= 0x7F && cp <= 0x9F) || (cp >= 0xD800 && cp <= 0xF8FF) ||
        cp >= 0xFFF0) {
      return fmt::format("ZooKeeper refuses the character U+{:04X} in a node path", cp);
    }
  }
  std::string root = "/";
  root += kRootName;
  std::string clock = "/";
  clock += kClockName;
  if (AtOrBelow(path, root) || AtOrBelow(path, clock)) {
    return fmt::format("{} and {} (and below) are leasehold's own nodes, not data", root, clock);
  }
  if (chroot.empty() && AtOrBelow(path, "/zookeeper")) {
    return "/zookeeper (and below) is ZooKeeper's own";
  }
  return "";
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
