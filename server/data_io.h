// The byte stream of a data-plane connection (server/tcp_frame.h): the socket itself, or TLS
// over it (server/tls_stream.h). Frames are read and written through this interface, so the
// framing, the server's connections and the client's are the same with and without TLS.
#ifndef PSCLUSTER_SERVER_DATA_IO_H_
#define PSCLUSTER_SERVER_DATA_IO_H_

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace pscluster {

class DataIo {
 public:
  explicit DataIo(int fd) : fd_(fd) {}
  virtual ~DataIo() = default;
  DataIo(const DataIo&) = delete;
  DataIo& operator=(const DataIo&) = delete;

  int fd() const { return fd_; }

  // As recv(): bytes read, 0 at the end of the stream, -1 with errno set (EAGAIN: `dontwait`
  // and nothing to read now). Without `dontwait` it waits for data (a non-blocking socket under
  // TLS: in poll()).
  virtual ssize_t Recv(void* data, size_t n, bool dontwait) {
    return recv(fd_, data, n, dontwait ? MSG_DONTWAIT : 0);
  }
  // As sendmsg() of `iov[0..n)`: bytes written (possibly fewer), -1 with errno set (EAGAIN:
  // nothing can be written now, or, without `dontwait`, the send timeout passed).
  virtual ssize_t Send(const iovec* iov, size_t n, bool dontwait) {
    msghdr m{};
    m.msg_iov = const_cast<iovec*>(iov);
    m.msg_iovlen = n;
    return sendmsg(fd_, &m, MSG_NOSIGNAL | (dontwait ? MSG_DONTWAIT : 0));
  }
  // Writes what Send() took but kept back (TLS: encrypted records gathered for one send()):
  // 1 when nothing is left, 0 when some is (`dontwait`, or the send timeout passed), -1 with
  // errno set on an error. A frame is out only once this says 1.
  virtual int Flush(bool dontwait) { return 1; }
  // Received bytes waiting above the socket (TLS records already read): poll() on fd() would
  // not see them, so readers look here first.
  virtual bool HasPending() { return false; }
  // What the last failed call's errno `err` means (TLS: OpenSSL's reason).
  virtual std::string ErrorText(int err) { return std::strerror(err); }

 protected:
  const int fd_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_DATA_IO_H_
