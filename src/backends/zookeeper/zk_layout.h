// File: backends/zookeeper/zk_layout.h (internal)
//
// The zk:// store's layout in the ZooKeeper tree (see zk_backend.h): node names and the bytes
// each kind of node holds, written and parsed in one place. Plain functions of strings: no
// client call, no zookeeper.h.
//
//   <chroot>/leasehold/<escaped key>/<id>-<sequence>   a grant or queued waiter (ephemeral):
//                                                      "<ttl ms>\n<token prefix>\n<holder>"
//   <chroot>/leasehold/<escaped key>/kept              a grant kept after its holder:
//                                                      "kept1\n<keep ms>\n<fencing token>\n
//                                                       <token prefix>\n<holder>"
//   <chroot>/leasehold/<escaped key>/record            the record: "<ttl ms>\n<bytes>"
//
// Example:
//
//   const std::string dir = base + "/" + zk_layout::EscapeKey("jobs/nightly");
//   zk_layout::SortBySequence(children);  // children.front() holds the key
//
// Thread safety: plain functions.

#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/lease_info.h"

namespace leasehold::internal::zk_layout {

// The node every key node lives under, below the chroot.
inline constexpr std::string_view kRootName = "leasehold";
// The node whose mtime is the leader's clock (ZkBackend::LeaderNow), below the chroot.
inline constexpr std::string_view kClockName = "leasehold-clock";
// Children of a key's node besides the queued ones (no '-': never taken for a queued node).
inline constexpr std::string_view kKeptName = "kept";
inline constexpr std::string_view kRecordName = "record";

// Node names: [A-Za-z0-9_-] stay, every other byte becomes %XX, so any key (with '/', '.',
// control characters or bytes ZooKeeper refuses) is one valid node name.
std::string EscapeKey(std::string_view key);
// The key of a node name; nullopt if it is not an escaped key (EscapeKey's output exactly: no
// other byte unescaped, upper-case hex, no escape of a byte EscapeKey keeps).
std::optional<std::string> UnescapeKey(std::string_view name);

// The keys among the key nodes `names` that start with `prefix`, in key order.
std::vector<std::string> KeysWithPrefix(const std::vector<std::string>& names,
                                        std::string_view prefix);

// The sequence number ZooKeeper appended: the 10 digits after the last '-'; -1 if none.
std::int64_t SequenceOf(std::string_view name);

// Orders children by sequence (never by whole name: the prefixes are random). Nodes that are
// not ours (no sequence) are dropped: never taken for a holder.
void SortBySequence(std::vector<std::string>& children);

// A grant's or waiter's node data.
std::string NodeData(Duration ttl, std::string_view owner_token, std::string_view holder);
// Reads a grant's node data; `czxid` (the node's) is the fencing token, and remaining = ttl (the
// server cannot say more).
LeaseInfo ParseNodeData(std::string_view key, std::string_view data, FencingToken czxid);

// The kept grant's node data. It is live until its mtime (the leader's time of the Finish) plus
// keep.
std::string KeptData(Duration keep, FencingToken fencing, std::string_view owner_token,
                     std::string_view holder);
// Parses a kept node; nullopt if it is not in our layout. `info.ttl` is the keep.
std::optional<LeaseInfo> ParseKeptData(std::string_view key, std::string_view data);

// The record's node data, live until its mtime plus the TTL.
std::string RecordData(Duration ttl, std::string_view record);
// A record node's data as RecordData wrote it: the TTL, and the record (a view into `data`).
struct RecordNode {
  Duration ttl{};
  std::string_view record;
};
// Reads a record node's data; nullopt if it is not in our layout.
std::optional<RecordNode> ParseRecordData(std::string_view data);

// Splits off the text up to the next '\n' as a number; false if there is none.
bool TakeNumber(std::string_view& text, std::int64_t* value);

// A node's mtime or ctime (milliseconds since the epoch, on the server's clock).
SystemTime FromZkMillis(std::int64_t ms);

// Why the store does not write the data node `path` (a FencedWrite key: a node path in the URL's
// chroot, which is `chroot`, "" for none), or "" if it does. Refused: a path that is not
// absolute, "/" itself (the chroot's own node), a trailing '/', an empty, "." or ".." component,
// what ZooKeeper refuses in a path (NUL, control characters, U+0080..U+009F, U+D800..U+F8FF,
// U+FFF0 and above, which includes every character outside the BMP, and bytes that are not
// UTF-8), leasehold's own nodes (/leasehold, /leasehold-clock and below) and, without a chroot,
// ZooKeeper's own (/zookeeper and below).
std::string DataPathProblem(std::string_view chroot, std::string_view path);

}  // namespace leasehold::internal::zk_layout
