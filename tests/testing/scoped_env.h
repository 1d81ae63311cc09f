// File: tests/testing/scoped_env.h
//
// ScopedEnv: sets (or, with nullopt, unsets) an environment variable for one scope and puts
// back what was there, for tests of code that reads the environment (Store::DefaultUrl, the
// SQLite store's default path).
//
// Example:
//
//   leasehold::testing::ScopedEnv state("LEASEHOLD_STATE_DIR", "/srv/leasehold");
//
// Thread safety: not thread-safe (setenv); use from the test's own thread.

#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace leasehold::testing {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name); old != nullptr) {
      old_ = old;
    }
    if (value.has_value()) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }

  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ScopedEnv(ScopedEnv&&) = delete;
  ScopedEnv& operator=(ScopedEnv&&) = delete;

  ~ScopedEnv() {
    if (old_.has_value()) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace leasehold::testing
