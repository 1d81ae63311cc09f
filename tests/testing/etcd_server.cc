// File: tests/testing/etcd_server.cc
//
// EtcdCluster: etcd members with every setting on the command line (started by
// testing/server_process.h), readiness by `etcdctl endpoint health`, stop by PID.

#include "testing/etcd_server.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace leasehold::testing {

using namespace std::chrono_literals;

EtcdCluster::EtcdCluster(EtcdClusterOptions options, std::string dir)
    : options_(std::move(options)), dir_(std::move(dir)) {}

Result<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(EtcdClusterOptions options) {
  if (access("/usr/bin/etcd", X_OK) != 0) {
    return Status::Unavailable("/usr/bin/etcd is missing (Debian package etcd-server)");
  }
  if (options.members < 1) {
    return Status::InvalidArgument("an etcd cluster needs at least one member");
  }
  char tmpl[] = "/tmp/leasehold-etcd-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    return Status::Unavailable("cannot create a temporary directory for etcd");
  }
  std::unique_ptr<EtcdCluster> cluster(new EtcdCluster(options, tmpl));
  std::vector<std::string> peers;
  std::vector<int> taken;
  for (int i = 0; i < options.members; ++i) {
    Member m;
    m.name = fmt::format("n{}", i);
    m.dir = fmt::format("{}/{}", cluster->dir_, m.name);
    // Distinct ports: a port picked a moment ago is still free, so avoid repeats ourselves.
    do {
      m.client_port = PickFreeLoopbackPort({2379, 2380, 6379});
    } while (std::find(taken.begin(), taken.end(), m.client_port) != taken.end());
    taken.push_back(m.client_port);
    do {
      m.peer_port = PickFreeLoopbackPort({2379, 2380, 6379});
    } while (std::find(taken.begin(), taken.end(), m.peer_port) != taken.end());
    taken.push_back(m.peer_port);
    if (m.client_port <= 0 || m.peer_port <= 0) {
      return Status::Unavailable("no free loopback port");
    }
    peers.push_back(fmt::format("{}=http://127.0.0.1:{}", m.name, m.peer_port));
    cluster->members_.push_back(std::move(m));
  }
  cluster->initial_cluster_ = fmt::format("{}", fmt::join(peers, ","));
  if (options.tls) {
    LH_RETURN_IF_ERROR(cluster->MakeCertificates());
  }
  for (int i = 0; i < options.members; ++i) {
    LH_RETURN_IF_ERROR(cluster->Launch(i));
  }
  for (int i = 0; i < options.members; ++i) {
    LH_RETURN_IF_ERROR(cluster->AwaitHealthy(i));
  }
  return cluster;
}

EtcdCluster::~EtcdCluster() {
  for (int i = 0; i < size(); ++i) {
    Kill9(i);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string EtcdCluster::Endpoint(int i) const {
  return fmt::format("127.0.0.1:{}", members_[i].client_port);
}

std::string EtcdCluster::Endpoints() const {
  std::vector<std::string> all;
  for (int i = 0; i < size(); ++i) {
    all.push_back(Endpoint(i));
  }
  return fmt::format("{}", fmt::join(all, ","));
}

std::string EtcdCluster::Url() const {
  return (options_.tls ? "etcds://" : "etcd://") + Endpoints();
}

Status EtcdCluster::MakeCertificates() {
  // P-256 keys (quick to make); certificates valid for a day.
  const std::string d = ShellQuote(dir_);
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const std::string script = fmt::format(
      "cd {d} && "
      "openssl req -x509 {key} -keyout ca-key.pem -out ca.pem -days 1 "
      "-subj /CN=leasehold-test-ca && "
      "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' "
      "> server.ext && "
      "openssl req {key} -keyout server-key.pem -out server.csr -subj /CN=127.0.0.1 && "
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial "
      "-out server.pem -days 1 -extfile server.ext && "
      "printf 'extendedKeyUsage=clientAuth\\n' > client.ext && "
      "openssl req {key} -keyout client-key.pem -out client.csr -subj /CN=leasehold-client && "
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial "
      "-out client.pem -days 1 -extfile client.ext",
      fmt::arg("d", d), fmt::arg("key", key));
  Result<std::string> out = RunCommand("timeout 30 sh -c " + ShellQuote(script));
  if (!out.ok()) {
    return out.status().WithContext("making test certificates with openssl");
  }
  return Status();
}

Status EtcdCluster::Launch(int i) {
  Member& m = members_[i];
  const std::string client =
      fmt::format("{}://127.0.0.1:{}", options_.tls ? "https" : "http", m.client_port);
  const std::string peer = fmt::format("http://127.0.0.1:{}", m.peer_port);
  std::vector<std::string> args = {"/usr/bin/etcd",
                                   "--name",
                                   m.name,
                                   "--data-dir",
                                   m.dir,
                                   "--listen-client-urls",
                                   client,
                                   "--advertise-client-urls",
                                   client,
                                   "--listen-peer-urls",
                                   peer,
                                   "--initial-advertise-peer-urls",
                                   peer,
                                   "--initial-cluster",
                                   initial_cluster_,
                                   "--initial-cluster-token",
                                   std::filesystem::path(dir_).filename().string(),
                                   "--initial-cluster-state",
                                   "new"};
  if (options_.tls) {
    args.insert(args.end(), {"--cert-file", CertPath("server.pem"), "--key-file",
                             CertPath("server-key.pem"), "--trusted-ca-file", CertPath("ca.pem")});
    if (options_.client_cert_auth) {
      args.push_back("--client-cert-auth");
    }
  }
  LH_ASSIGN_OR_RETURN(m.pid, SpawnServer(args, fmt::format("{}/{}.log", dir_, m.name)));
  return Status();
}

Status EtcdCluster::AwaitHealthy(int i) {
  Member& m = members_[i];
  Status ready = AwaitReady(
      m.pid,
      [this, i] {
        Result<std::string> out = Etcdctl({"endpoint", "health"}, i);
        return out.ok() && out->find("is healthy") != std::string::npos;
      },
      options_.ready_timeout, fmt::format("{}/{}.log", dir_, m.name), "etcd");
  if (!ready.ok()) {
    Kill9(i);
  }
  return ready;
}

void EtcdCluster::Kill9(int i) {
  StopPid(members_[i].pid, SIGKILL);
}

Status EtcdCluster::Restart(int i) {
  Kill9(i);
  LH_RETURN_IF_ERROR(Launch(i));
  return AwaitHealthy(i);
}

void EtcdCluster::Pause(int i) {
  if (members_[i].pid > 0) {
    kill(members_[i].pid, SIGSTOP);
  }
}

void EtcdCluster::Resume(int i) {
  if (members_[i].pid > 0) {
    kill(members_[i].pid, SIGCONT);
  }
}

std::optional<int> EtcdCluster::LeaderIndex() const {
  for (int i = 0; i < size(); ++i) {
    if (members_[i].pid <= 0) {
      continue;
    }
    // -w simple: "ENDPOINT, ID, VERSION, DB SIZE, IS LEADER, ..."
    Result<std::string> out = Etcdctl({"endpoint", "status", "-w", "simple"}, i);
    if (!out.ok()) {
      continue;
    }
    std::vector<std::string> fields;
    std::string_view rest = *out;
    for (std::size_t comma; (comma = rest.find(", ")) != std::string_view::npos;) {
      fields.emplace_back(rest.substr(0, comma));
      rest.remove_prefix(comma + 2);
    }
    if (fields.size() > 4 && fields[4] == "true") {
      return i;
    }
  }
  return std::nullopt;
}

Result<std::string> EtcdCluster::Etcdctl(const std::vector<std::string>& args, int member) const {
  std::string endpoints;
  if (member >= 0) {
    endpoints = Endpoint(member);
  } else {
    std::vector<std::string> live;
    for (int i = 0; i < size(); ++i) {
      if (members_[i].pid > 0) {
        live.push_back(Endpoint(i));
      }
    }
    endpoints = fmt::format("{}", fmt::join(live, ","));
  }
  std::string command = fmt::format(
      "ETCDCTL_API=3 timeout 10 /usr/bin/etcdctl --dial-timeout=2s --command-timeout=5s "
      "--endpoints={}",
      endpoints);
  if (!etcdctl_user_.empty()) {
    command += " --user=" + ShellQuote(etcdctl_user_);
  }
  if (options_.tls) {
    command +=
        fmt::format(" --cacert={} --cert={} --key={}", ShellQuote(CertPath("ca.pem")),
                    ShellQuote(CertPath("client.pem")), ShellQuote(CertPath("client-key.pem")));
  }
  for (const std::string& arg : args) {
    command += " " + ShellQuote(arg);
  }
  return RunCommand(command);
}

namespace {

// Decodes standard base64 (etcdctl's JSON prints keys and values so); nullopt if malformed.
std::optional<std::string> DecodeBase64(std::string_view in) {
  std::string out;
  std::uint32_t bits = 0;
  int count = 0;
  for (char c : in) {
    int v = -1;
    if (c >= 'A' && c <= 'Z') {
      v = c - 'A';
    } else if (c >= 'a' && c <= 'z') {
      v = c - 'a' + 26;
    } else if (c >= '0' && c <= '9') {
      v = c - '0' + 52;
    } else if (c == '+') {
      v = 62;
    } else if (c == '/') {
      v = 63;
    } else if (c == '=') {
      break;
    } else {
      return std::nullopt;
    }
    bits = (bits << 6) | static_cast<std::uint32_t>(v);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out += static_cast<char>((bits >> count) & 0xff);
    }
  }
  return out;
}

// Parses the "kvs" array of `etcdctl get -w json`: flat objects whose fields are numbers or
// base64 strings (no nesting, no escapes).
Result<std::vector<EtcdKeyValue>> ParseKvs(std::string_view json) {
  std::vector<EtcdKeyValue> out;
  const std::size_t kvs = json.find("\"kvs\":[");
  if (kvs == std::string_view::npos) {
    if (json.find("\"header\"") == std::string_view::npos) {
      return Status::Internal(fmt::format("unexpected etcdctl output: {}", json));
    }
    return out;  // etcd leaves out an empty kvs
  }
  std::size_t at = kvs + 7;
  while (at < json.size() && json[at] == '{') {
    const std::size_t end = json.find('}', at);
    if (end == std::string_view::npos) {
      return Status::Internal(fmt::format("unterminated key in etcdctl output: {}", json));
    }
    std::string_view object = json.substr(at + 1, end - at - 1);
    EtcdKeyValue kv;
    while (!object.empty()) {
      const std::size_t colon = object.find(':');
      const std::size_t comma = object.find(',');
      if (colon == std::string_view::npos || object.front() != '"') {
        return Status::Internal(fmt::format("malformed etcdctl output: {}", json));
      }
      const std::string_view name = object.substr(1, colon - 2);
      std::string_view value = object.substr(
          colon + 1, comma == std::string_view::npos ? std::string_view::npos : comma - colon - 1);
      object.remove_prefix(comma == std::string_view::npos ? object.size() : comma + 1);
      if (!value.empty() && value.front() == '"') {
        value = value.substr(1, value.size() - 2);
      }
      if (name == "key" || name == "value") {
        std::optional<std::string> decoded = DecodeBase64(value);
        if (!decoded) {
          return Status::Internal(fmt::format("bad base64 in etcdctl output: {}", value));
        }
        (name == "key" ? kv.key : kv.value) = std::move(*decoded);
      } else if (name == "create_revision" || name == "mod_revision" || name == "lease") {
        std::int64_t n = std::strtoll(std::string(value).c_str(), nullptr, 10);
        (name == "lease"             ? kv.lease
         : name == "create_revision" ? kv.create_revision
                                     : kv.mod_revision) = n;
      }
    }
    out.push_back(std::move(kv));
    at = end + 1;
    if (at < json.size() && json[at] == ',') {
      ++at;
    }
  }
  return out;
}

}  // namespace

Result<std::vector<EtcdKeyValue>> EtcdCluster::Get(const std::string& key, bool prefix) const {
  std::vector<std::string> args = {"get", "-w", "json"};
  if (prefix) {
    args.push_back("--prefix");
  }
  args.push_back("--");  // a key may start with '-'
  args.push_back(key);
  LH_ASSIGN_OR_RETURN(std::string json, Etcdctl(args));
  return ParseKvs(json);
}

Status EtcdCluster::EnableAuth(const std::string& root_password) {
  LH_RETURN_IF_ERROR(Etcdctl({"user", "add", "root:" + root_password}).status());
  LH_RETURN_IF_ERROR(Etcdctl({"auth", "enable"}).status());
  etcdctl_user_ = "root:" + root_password;
  return Status();
}

}  // namespace leasehold::testing
