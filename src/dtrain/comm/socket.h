// What the comm layer's TCP code shares (internal to the comm layer).
#pragma once

#include <netdb.h>
#include <netinet/in.h>

#include <cstdint>
#include <string>

#include "dtrain/core/error.h"

namespace dtrain::comm::detail {

// host (a name or an IPv4 address) and port as an IPv4 socket address; an IoError
// starting with `who` when the name does not resolve.
inline sockaddr_in resolve(const std::string& host, int port, const std::string& who) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr)
    DTRAIN_THROW(IoError, who, ": cannot resolve host '", host, "'");
  sockaddr_in a = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  freeaddrinfo(found);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  return a;
}

}  // namespace dtrain::comm::detail
