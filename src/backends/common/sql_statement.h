// File: backends/common/sql_statement.h (internal)
//
// What the SQL stores (sqlite://, postgres://) check in a fenced write's statement (FencedOp
// kSql) before they run it inside their own transaction: its leading keyword, so that a
// statement that would end or split that transaction (COMMIT, ROLLBACK, SAVEPOINT...) is refused
// rather than sent. It looks at the first words only, so each store makes sure there is no
// second statement to hide one in: SQLite checks sqlite3_prepare's tail (and its authorizer sees
// every action), PostgreSQL's extended protocol takes one statement per message; and inside a
// transaction block PostgreSQL itself refuses a COMMIT from a DO block or a procedure (2D000).
//
// Example:
//
//   if (std::string_view word = TransactionControlKeyword(LeadingSqlKeywords(sql));
//       !word.empty()) {
//     return Status::InvalidArgument(...);
//   }
//
// Thread safety: pure functions.

#pragma once

#include <cctype>
#include <string>
#include <string_view>

namespace leasehold::internal {

// Returns the first two words of `sql` in upper case, separated by one space ("PREPARE
// TRANSACTION", "COMMIT", "" for none), skipping white space, "-- ..." line comments and
// "/* ... */" block comments (nested, as PostgreSQL reads them) before and between them. A word is
// a run of ASCII letters and underscores; anything else ends the scan.
inline std::string LeadingSqlKeywords(std::string_view sql) {
  std::string out;
  std::size_t i = 0;
  for (int words = 0; words < 2;) {
    // White space and comments.
    while (i < sql.size()) {
      if (std::isspace(static_cast<unsigned char>(sql[i])) != 0) {
        ++i;
      } else if (sql.substr(i, 2) == "--") {
        const std::size_t end = sql.find('\n', i);
        i = end == std::string_view::npos ? sql.size() : end + 1;
      } else if (sql.substr(i, 2) == "/*") {
        int depth = 0;
        while (i < sql.size()) {
          if (sql.substr(i, 2) == "/*") {
            ++depth;
            i += 2;
          } else if (sql.substr(i, 2) == "*/") {
            i += 2;
            if (--depth == 0) {
              break;
            }
          } else {
            ++i;
          }
        }
      } else {
        break;
      }
    }
    const std::size_t start = i;
    while (i < sql.size() &&
           (std::isalpha(static_cast<unsigned char>(sql[i])) != 0 || sql[i] == '_')) {
      ++i;
    }
    if (i == start) {
      break;
    }
    if (!out.empty()) {
      out += ' ';
    }
    for (std::size_t k = start; k < i; ++k) {
      out += static_cast<char>(std::toupper(static_cast<unsigned char>(sql[k])));
    }
    ++words;
  }
  return out;
}

// Returns the transaction-control command that `leading` (LeadingSqlKeywords) starts, or "" if
// none: BEGIN, START (TRANSACTION), COMMIT, END, ROLLBACK, ABORT, SAVEPOINT, RELEASE (SAVEPOINT),
// PREPARE TRANSACTION, and SQLite's ATTACH, DETACH and VACUUM, which cannot run inside (or would
// escape) the write's transaction.
inline std::string_view TransactionControlKeyword(std::string_view leading) {
  const std::string_view first = leading.substr(0, leading.find(' '));
  for (std::string_view word : {"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT",
                                "RELEASE", "ATTACH", "DETACH", "VACUUM"}) {
    if (first == word) {
      return word;
    }
  }
  if (leading == "PREPARE TRANSACTION") {
    return "PREPARE TRANSACTION";
  }
  return {};
}

}  // namespace leasehold::internal
