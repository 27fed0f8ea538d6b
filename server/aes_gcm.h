// AES-GCM (NIST SP 800-38D) with the x86 vector instructions for AES and carry-less multiplication
// (VAES, VPCLMULQDQ) on 512-bit registers with AVX-512, or on 256-bit ones with AVX2 where
// AVX-512 is missing, for the records of the TLS data plane
// (server/tls_stream.h). The system's OpenSSL 3.0 has no code path for these instructions and
// seals about 4.5 GB/s per core with AES-NI on 128-bit registers; this runs four (or two) blocks
// per instruction. Only the record layer's AES-128-GCM and AES-256-GCM use it, and only where
// Supported() says the CPU has every instruction it needs; everything else stays with OpenSSL.
//
// The operations are split the way a TLS record needs them: Crypt() XORs the counter-mode key
// stream into any run of bytes of a message (so a record is sealed piece by piece from the frame's
// buffers straight into the send buffer), Tag() authenticates a whole sealed message in one pass
// (a record is opened only after its tag checks, so no unauthenticated byte reaches the caller).
// Nonces are 96 bits (the only size TLS uses). The instructions run in constant time; nothing
// branches or indexes on secret data. Checked against OpenSSL's EVP AES-GCM for every message
// length up to 1,100 bytes, split at every offset, with additional data of 0 to 40 bytes, and
// the test vectors of the GCM specification (server/aes_gcm_test.cc).
#ifndef PSCLUSTER_SERVER_AES_GCM_H_
#define PSCLUSTER_SERVER_AES_GCM_H_

#include <cstddef>

namespace pscluster {

class VectorAesGcm {
 public:
  static constexpr size_t kNonceBytes = 12;
  static constexpr size_t kTagBytes = 16;

  // Whether this CPU (the build being x86-64) has what the 256-bit code needs (AES-NI, PCLMULQDQ,
  // AVX2, VAES, VPCLMULQDQ) or the 512-bit code (those and AVX-512 F/BW/VL): `bits` 256 or 512.
  static bool Supports(int bits);
  // Supports(256): the narrowest. Nothing else may be called when it is false.
  static bool Supported();

  // `bits`: the register width, 256 or 512; 0 = the widest this CPU supports.
  explicit VectorAesGcm(int bits = 0);
  int bits() const { return bits_; }
  ~VectorAesGcm();  // The round keys and powers of H are wiped.
  VectorAesGcm(const VectorAesGcm&) = delete;
  VectorAesGcm& operator=(const VectorAesGcm&) = delete;

  // A 16- or 32-byte key (AES-128, AES-256); false for any other length, or when the CPU lacks
  // the instructions of this width.
  bool SetKey(const unsigned char* key, size_t key_len);

  // XORs `n` bytes of `in` with the key stream of `nonce`, starting at byte `pos` of the message,
  // into `out` (which may be `in`). Encrypts and decrypts.
  void Crypt(const unsigned char* nonce, size_t pos, const unsigned char* in, unsigned char* out,
             size_t n) const;

  // The tag of a message: additional data `aad`, then the ciphertext `ct`.
  void Tag(const unsigned char* nonce, const unsigned char* aad, size_t aad_len,
           const unsigned char* ct, size_t ct_len, unsigned char* tag) const;

 private:
  alignas(64) unsigned char round_keys_[15 * 16] = {};
  // H^32 .. H^1 (H = AES(K, 0)), byte-reversed: block i of a group of 32 multiplies by
  // H^(32 - i); then the same powers with their two halves XORed (for Karatsuba).
  alignas(64) unsigned char h_powers_[2 * 32 * 16] = {};
  int rounds_ = 0;
  const int bits_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_AES_GCM_H_
