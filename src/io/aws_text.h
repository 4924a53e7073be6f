#pragma once
// The text handling AWS requests, answers and shared files need: S3's own
// requests and the credential sources (STS, the shared files) both use it,
// so it lives below both rather than in either.

#include <cstddef>
#include <optional>
#include <string>

namespace ckpt {

// `s` without the spaces, tabs and line ends at either end (the shared
// files' lines, HTTP header values).
std::string trimmed(const std::string& s);

// RFC 3986 percent-encoding as SigV4 wants it: unreserved characters stay,
// and '/' too when `keep_slash` (a key is a path).
std::string uri_encode(const std::string& s, bool keep_slash);

// The text of the first <tag>...</tag> in `xml` at or after `from` (XML
// entities decoded); nullopt when absent. *end (when given) is set past it.
std::optional<std::string> xml_element(const std::string& xml, const std::string& tag, std::size_t from = 0,
                                       std::size_t* end = nullptr);

}  // namespace ckpt
