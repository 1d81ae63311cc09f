// File: tests/fuzz/zk_layout_fuzz.cc
//
// The zk:// store's node names and node data (backends/zookeeper/zk_layout.h): what leasehold
// reads back from ZooKeeper, where any client with access to the chroot may have written.
// Invariants:
// - ParseNodeData, ParseKeptData and ParseRecordData give a TTL >= 0, and what they read,
//   written again with NodeData, KeptData or RecordData, reads back the same.
// - UnescapeKey accepts exactly the names EscapeKey writes: UnescapeKey(EscapeKey(k)) == k, and
//   a name it accepts is EscapeKey of its key.
// - SequenceOf is -1 or >= 0; SortBySequence keeps only names with a sequence, in order.
// - DataPathProblem accepts only an absolute path of non-empty components other than "." and
//   "..", without a control character, outside leasehold's own nodes.

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "backends/zookeeper/zk_layout.h"
#include "fuzz_check.h"

namespace {

using leasehold::Duration;
using leasehold::LeaseInfo;
using namespace leasehold::internal::zk_layout;
using std::chrono::milliseconds;

bool AtOrBelow(std::string_view path, std::string_view node) {
  return path.starts_with(node) && (path.size() == node.size() || path[node.size()] == '/');
}

void CheckNodeData(std::string_view data) {
  const LeaseInfo info = ParseNodeData("k", data, 42);
  FUZZ_CHECK(info.fencing_token == 42 && info.key == "k", "fields not ours");
  FUZZ_CHECK(info.ttl >= Duration::zero(), std::to_string(info.ttl.count()));
  if (info.token_prefix.size() <= 8 && info.token_prefix.find('\n') == std::string::npos) {
    const LeaseInfo again =
        ParseNodeData("k", NodeData(info.ttl, info.token_prefix, info.holder), 42);
    FUZZ_CHECK(again.ttl == info.ttl && again.token_prefix == info.token_prefix &&
                   again.holder == info.holder,
               "node data does not read back");
  }
}

void CheckKeptData(std::string_view data) {
  std::optional<LeaseInfo> info = ParseKeptData("k", data);
  if (!info) {
    return;
  }
  FUZZ_CHECK(info->ttl >= Duration::zero(), std::to_string(info->ttl.count()));
  if (info->token_prefix.size() <= 8) {
    std::optional<LeaseInfo> again = ParseKeptData(
        "k", KeptData(info->ttl, info->fencing_token, info->token_prefix, info->holder));
    FUZZ_CHECK(again && again->ttl == info->ttl && again->fencing_token == info->fencing_token &&
                   again->token_prefix == info->token_prefix && again->holder == info->holder,
               "kept data does not read back: fencing " + std::to_string(info->fencing_token));
  }
}

void CheckRecordData(std::string_view data) {
  std::optional<RecordNode> node = ParseRecordData(data);
  if (!node) {
    return;
  }
  FUZZ_CHECK(node->ttl >= Duration::zero(), std::to_string(node->ttl.count()));
  const std::string written = RecordData(node->ttl, node->record);
  std::optional<RecordNode> again = ParseRecordData(written);
  FUZZ_CHECK(again && again->ttl == node->ttl && again->record == node->record,
             "record does not read back");
}

void CheckNames(std::string_view text) {
  const std::string escaped = EscapeKey(text);
  std::optional<std::string> key = UnescapeKey(escaped);
  FUZZ_CHECK(key && *key == text, escaped);
  FUZZ_CHECK(escaped.find_first_of("/.\0", 0, 3) == std::string::npos, escaped);
  if (std::optional<std::string> read = UnescapeKey(text)) {
    FUZZ_CHECK(EscapeKey(*read) == text, "accepted a name EscapeKey never writes");
  }
  const std::int64_t seq = SequenceOf(text);
  FUZZ_CHECK(seq >= -1, std::to_string(seq));
  std::vector<std::string> children;
  std::string_view rest = text;
  while (!rest.empty() && children.size() < 16) {
    std::size_t nl = rest.find('\n');
    children.emplace_back(rest.substr(0, nl));
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
  }
  SortBySequence(children);
  for (std::size_t i = 0; i < children.size(); ++i) {
    FUZZ_CHECK(SequenceOf(children[i]) >= 0, children[i]);
    FUZZ_CHECK(i == 0 || SequenceOf(children[i - 1]) <= SequenceOf(children[i]), "order");
  }
}

void CheckDataPath(std::string_view path) {
  for (std::string_view chroot : {std::string_view(), std::string_view("/app")}) {
    if (!DataPathProblem(chroot, path).empty()) {
      continue;
    }
    FUZZ_CHECK(path.starts_with('/') && path.size() > 1 && !path.ends_with('/'), path);
    FUZZ_CHECK(path.find("//") == std::string_view::npos, path);
    FUZZ_CHECK(path.find("/./") == std::string_view::npos && !path.ends_with("/.") &&
                   path.find("/../") == std::string_view::npos && !path.ends_with("/.."),
               path);
    for (char c : path) {
      const auto byte = static_cast<unsigned char>(c);
      FUZZ_CHECK(byte >= 0x20 && byte != 0x7F, path);
    }
    FUZZ_CHECK(!AtOrBelow(path, "/leasehold") && !AtOrBelow(path, "/leasehold-clock"), path);
    FUZZ_CHECK(!chroot.empty() || !AtOrBelow(path, "/zookeeper"), path);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text = leasehold::fuzz::AsText(data, size);
  CheckNodeData(text);
  CheckKeptData(text);
  CheckRecordData(text);
  CheckNames(text);
  CheckDataPath(text);
  return 0;
}
