#pragma once
// The two bits of text handling every AWS API answer and request needs:
// S3's own requests and the credential endpoints (STS) both use them, so they
// live below both rather than in either.

#include <cstddef>
#include <optional>
#include <string>

namespace ckpt {

// RFC 3986 percent-encoding as SigV4 wants it: unreserved characters stay,
// and '/' too when `keep_slash` (a key is a path).
std::string uri_encode(const std::string& s, bool keep_slash);

// The text of the first <tag>...</tag> in `xml` at or after `from` (XML
// entities decoded); nullopt when absent. *end (when given) is set past it.
std::optional<std::string> xml_element(const std::string& xml, const std::string& tag, std::size_t from = 0,
                                       std::size_t* end = nullptr);

}  // namespace ckpt
