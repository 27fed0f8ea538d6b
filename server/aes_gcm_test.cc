#include "server/aes_gcm.h"

#include <openssl/evp.h>

#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using Bytes = std::vector<unsigned char>;

Bytes Hex(const std::string& hex) {
  const std::string raw = absl::HexStringToBytes(hex);
  return Bytes(raw.begin(), raw.end());
}

Bytes RandomBytes(std::mt19937& rng, size_t n) {
  Bytes b(n);
  for (auto& c : b) c = static_cast<unsigned char>(rng());
  return b;
}

std::string ToHex(const Bytes& b) {
  return absl::BytesToHexString(std::string(b.begin(), b.end()));
}

// OpenSSL's EVP AES-GCM: ciphertext and tag.
std::pair<Bytes, Bytes> OpenSslSeal(const Bytes& key, const Bytes& nonce, const Bytes& aad,
                                    const Bytes& plain) {
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  const EVP_CIPHER* cipher = key.size() == 16 ? EVP_aes_128_gcm() : EVP_aes_256_gcm();
  Bytes out(plain.size() + 16), tag(16);
  int len = 0, fin = 0;
  EXPECT_EQ(EVP_EncryptInit_ex(ctx, cipher, nullptr, key.data(), nonce.data()), 1);
  if (!aad.empty()) {
    EXPECT_EQ(EVP_EncryptUpdate(ctx, nullptr, &len, aad.data(), static_cast<int>(aad.size())), 1);
  }
  EXPECT_EQ(EVP_EncryptUpdate(ctx, out.data(), &len, plain.data(), static_cast<int>(plain.size())),
            1);
  EXPECT_EQ(EVP_EncryptFinal_ex(ctx, out.data() + len, &fin), 1);
  EXPECT_EQ(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, tag.data()), 1);
  EVP_CIPHER_CTX_free(ctx);
  out.resize(plain.size());
  return {out, tag};
}

std::pair<Bytes, Bytes> VectorSeal(const VectorAesGcm& gcm, const Bytes& nonce, const Bytes& aad,
                                   const Bytes& plain) {
  Bytes out(plain.size()), tag(16);
  gcm.Crypt(nonce.data(), 0, plain.data(), out.data(), plain.size());
  gcm.Tag(nonce.data(), aad.data(), aad.size(), out.data(), out.size(), tag.data());
  return {out, tag};
}

// Each register width: 512-bit (AVX-512) and 256-bit (AVX2), each where the CPU has it.
class VectorAesGcmTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!VectorAesGcm::Supports(GetParam())) {
      GTEST_SKIP() << "this CPU lacks what the " << GetParam()
                   << "-bit code needs (VAES, VPCLMULQDQ, AVX2 or AVX-512)";
    }
  }
};

INSTANTIATE_TEST_SUITE_P(Widths, VectorAesGcmTest, ::testing::Values(256, 512),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("Bits", info.param);
                         });

TEST(VectorAesGcmWidthTest, TheDefaultIsTheWidestSupported) {
  if (!VectorAesGcm::Supported()) GTEST_SKIP() << "no VAES/VPCLMULQDQ on this CPU";
  EXPECT_EQ(VectorAesGcm().bits(), VectorAesGcm::Supports(512) ? 512 : 256);
}

// The test vectors of "The Galois/Counter Mode of Operation (GCM)" (McGrew and Viega), test
// cases 1 to 4 (AES-128) and 13 to 16 (AES-256), 96-bit IVs.
TEST_P(VectorAesGcmTest, MatchesTheSpecificationsTestVectors) {
  struct Case {
    const char* key;
    const char* iv;
    const char* plain;
    const char* aad;
    const char* cipher;
    const char* tag;
  };
  const std::string p3 =
      "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449"
      "a6b525b16aedf5aa0de657ba637b391aafd255";
  const std::string p4 = p3.substr(0, 120);
  const std::string c3 =
      "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e21d514b25466931c7d8f6a5aac"
      "84aa051ba30b396a0aac973d58e091473f5985";
  const std::string c15 =
      "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056"
      "828838c5f61e6393ba7a0abcc9f662898015ad";
  const std::string k3 = "feffe9928665731c6d6a8f9467308308";
  const std::string k15 = k3 + k3;
  const std::string iv3 = "cafebabefacedbaddecaf888";
  const std::string a4 = "feedfacedeadbeeffeedfacedeadbeefabaddad2";
  const std::string zero16(32, '0'), zero32(64, '0'), zero12(24, '0');
  const std::string c4 = c3.substr(0, 120), c16 = c15.substr(0, 120);
  const Case cases[] = {
      {zero16.c_str(), zero12.c_str(), "", "", "", "58e2fccefa7e3061367f1d57a4e7455a"},
      {zero16.c_str(), zero12.c_str(), zero16.c_str(), "", "0388dace60b6a392f328c2b971b2fe78",
       "ab6e47d42cec13bdf53a67b21257bddf"},
      {k3.c_str(), iv3.c_str(), p3.c_str(), "", c3.c_str(), "4d5c2af327cd64a62cf35abd2ba6fab4"},
      {k3.c_str(), iv3.c_str(), p4.c_str(), a4.c_str(), c4.c_str(),
       "5bc94fbc3221a5db94fae95ae7121a47"},
      {zero32.c_str(), zero12.c_str(), "", "", "", "530f8afbc74536b9a963b4f1c4cb738b"},
      {zero32.c_str(), zero12.c_str(), zero16.c_str(), "", "cea7403d4d606b6e074ec5d3baf39d18",
       "d0d1c8a799996bf0265b98b5d48ab919"},
      {k15.c_str(), iv3.c_str(), p3.c_str(), "", c15.c_str(), "b094dac5d93471bdec1a502270e3cc6c"},
      {k15.c_str(), iv3.c_str(), p4.c_str(), a4.c_str(), c16.c_str(),
       "76fc6ece0f4e1768cddf8853bb2d551b"},
  };
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << n++);
    VectorAesGcm gcm(GetParam());
    const Bytes key = Hex(c.key);
    ASSERT_TRUE(gcm.SetKey(key.data(), key.size()));
    const auto [cipher, tag] = VectorSeal(gcm, Hex(c.iv), Hex(c.aad), Hex(c.plain));
    EXPECT_EQ(ToHex(cipher), c.cipher);
    EXPECT_EQ(ToHex(tag), c.tag);
  }
}

// Every length from 0 to 1,100 bytes (all the register and tail paths), additional data of 0 to
// 40 bytes, both key sizes, random keys and nonces: the same bytes and tag as OpenSSL.
TEST_P(VectorAesGcmTest, AgreesWithOpenSslOnEveryLength) {
  std::mt19937 rng(7);
  auto random = [&rng](size_t n) { return RandomBytes(rng, n); };
  for (size_t key_len : {16, 32}) {
    for (size_t len = 0; len <= 1100; ++len) {
      const Bytes key = random(key_len), nonce = random(12), aad = random(len % 41),
                  plain = random(len);
      VectorAesGcm gcm(GetParam());
      ASSERT_TRUE(gcm.SetKey(key.data(), key.size()));
      const auto expected = OpenSslSeal(key, nonce, aad, plain);
      const auto got = VectorSeal(gcm, nonce, aad, plain);
      ASSERT_EQ(got.first, expected.first) << "key " << key_len << " length " << len;
      ASSERT_EQ(got.second, expected.second) << "key " << key_len << " length " << len;
    }
  }
}

// A TLS record as the record layer seals it: in pieces from several buffers, each starting where
// the last ended (mid-block too); and a record of 16 KiB, and a message of 1 MiB.
TEST_P(VectorAesGcmTest, PiecesMatchTheWholeMessage) {
  std::mt19937 rng(11);
  auto random = [&rng](size_t n) { return RandomBytes(rng, n); };
  for (size_t len : {size_t{300}, size_t{16385}, size_t{1} << 20}) {
    const Bytes key = random(16), nonce = random(12), aad = random(5), plain = random(len);
    VectorAesGcm gcm(GetParam());
    ASSERT_TRUE(gcm.SetKey(key.data(), key.size()));
    const auto expected = OpenSslSeal(key, nonce, aad, plain);
    for (int trial = 0; trial < 20; ++trial) {
      Bytes out(len);
      for (size_t pos = 0; pos < len;) {
        const size_t take = std::min<size_t>(len - pos, 1 + rng() % (trial < 10 ? 40 : 5000));
        gcm.Crypt(nonce.data(), pos, plain.data() + pos, out.data() + pos, take);
        pos += take;
      }
      ASSERT_EQ(out, expected.first) << "length " << len << " trial " << trial;
    }
    // Decryption in place gives the message back; the tag is over the ciphertext.
    Bytes buf = expected.first, tag(16);
    gcm.Tag(nonce.data(), aad.data(), aad.size(), buf.data(), buf.size(), tag.data());
    EXPECT_EQ(tag, expected.second);
    gcm.Crypt(nonce.data(), 0, buf.data(), buf.data(), buf.size());
    EXPECT_EQ(buf, plain);
  }
}

// One flipped bit anywhere changes the tag; a wrong key length is refused.
TEST_P(VectorAesGcmTest, AnyChangeChangesTheTagAndBadKeysAreRefused) {
  const Bytes key(16, 0x42), nonce(12, 0x17), aad = {23, 3, 3, 1, 0};
  Bytes ct(200, 0x5a), tag(16), other(16);
  VectorAesGcm gcm(GetParam());
  ASSERT_TRUE(gcm.SetKey(key.data(), key.size()));
  gcm.Tag(nonce.data(), aad.data(), aad.size(), ct.data(), ct.size(), tag.data());
  for (size_t bit = 0; bit < ct.size() * 8; bit += 7) {
    ct[bit / 8] ^= static_cast<unsigned char>(1 << (bit % 8));
    gcm.Tag(nonce.data(), aad.data(), aad.size(), ct.data(), ct.size(), other.data());
    EXPECT_NE(other, tag) << "bit " << bit;
    ct[bit / 8] ^= static_cast<unsigned char>(1 << (bit % 8));
  }
  VectorAesGcm bad(GetParam());
  EXPECT_FALSE(bad.SetKey(key.data(), 24));
  EXPECT_FALSE(bad.SetKey(key.data(), 0));
}

}  // namespace
}  // namespace pscluster
