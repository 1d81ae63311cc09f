// File: tools/cli/unique_fd.h
//
// UniqueFd: owns one file descriptor and closes it on destruction.
//
// Example:
//
//   UniqueFd fd(::eventfd(0, EFD_CLOEXEC));
//   if (!fd.valid()) return errno;
//
// Thread safety: not thread-safe; get() may be called from any thread while the owner lives.

#pragma once

#include <unistd.h>

#include <utility>

namespace leasehold::cli {

class UniqueFd {
 public:
  UniqueFd() = default;

  explicit UniqueFd(int fd) : fd_(fd) {}

  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }

  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  ~UniqueFd() { Reset(); }

  [[nodiscard]] int get() const { return fd_; }

  [[nodiscard]] bool valid() const { return fd_ >= 0; }

  void Reset() {
    if (fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }

 private:
  int fd_ = -1;
};

}  // namespace leasehold::cli
