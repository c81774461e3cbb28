// engine/data/bpe_tokenizer.cpp: see bpe_tokenizer.h.
#include "engine/data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <array>
#include <climits>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "common/user_error.h"
#include "engine/data/utf8.h"

namespace fs = std::filesystem;

namespace retort::engine {
namespace {

// GPT-2's byte-level pre-tokenizer regex (ByteLevel with use_regex).
const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A compiled PCRE2 pattern (UTF, Unicode properties for \s, \d, \w).
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& source) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      throw UserError("'" + source + "': pre-tokenizer regex does not compile at offset " +
                      std::to_string(offset) + ": " + reinterpret_cast<char*>(message));
    }
    data_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  ~Regex() {
    pcre2_match_data_free(data_);
    pcre2_code_free(code_);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Splits `text` into its matches and the gaps between them, in order (Split "Isolated").
  void split(std::string_view text, std::vector<std::string_view>& out) const {
    size_t at = 0, last = 0;
    while (at <= text.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at,
                                 0, data_, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* v = pcre2_get_ovector_pointer(data_);
      const size_t begin = v[0], end = v[1];
      if (end == begin) {  // an empty match: step over one code point
        at = begin + 1;
        while (at < text.size() && (uint8_t(text[at]) & 0xC0) == 0x80) ++at;
        continue;
      }
      if (begin > last) out.push_back(text.substr(last, begin - last));
      out.push_back(text.substr(begin, end - begin));
      last = at = end;
    }
    if (last < text.size()) out.push_back(text.substr(last));
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_data* data_ = nullptr;
};

// GPT-2's map from bytes to printable characters (as UTF-8 strings).
std::array<std::string, 256> byte_characters() {
  std::array<std::string, 256> map;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    append_utf8(map[b], printable ? uint32_t(b) : uint32_t(next++));
  }
  return map;
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw UserError("cannot read tokenizer file '" + path.string() + "'");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw UserError("'" + path.string() + "' is not a JSON object");
  return j;
}

// Unicode NFC of valid UTF-8 text (ICU).
std::string nfc_normalize(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) throw UserError("ICU has no NFC normalizer");
  const icu::UnicodeString normal = nfc->normalize(
      icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), int32_t(text.size()))), status);
  if (U_FAILURE(status)) throw UserError("NFC normalisation failed");
  std::string out;
  normal.toUTF8String(out);
  return out;
}

struct PreStep {
  std::unique_ptr<Regex> split;  // Split by regex
  bool byte_level = false, prefix_space = false;
  std::unique_ptr<Regex> byte_level_regex;  // ByteLevel with use_regex
};

struct AddedToken {
  std::string content;
  int64_t id;
};

}  // namespace

struct BpeTokenizer::Impl {
  std::string source;
  std::unordered_map<std::string, int64_t> vocab;
  std::unordered_map<std::string, int> ranks;  // "left right" -> merge rank
  bool ignore_merges = false;
  bool nfc = false;  // the NFC normalizer, applied to text outside added tokens
  std::vector<PreStep> steps;
  std::vector<AddedToken> added;        // longest first
  std::vector<int64_t> prefix, suffix;  // the template around a single sequence
  int64_t vocab_size = 0;
  std::optional<int64_t> eos;
  std::array<std::string, 256> bytes = byte_characters();
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache;
  // For decode, built on its first call.
  mutable std::vector<std::string> id_to_token;
  mutable std::unordered_set<int64_t> special;
  mutable std::unordered_map<std::string, char> byte_of;

  [[noreturn]] void refuse(const std::string& what) const {
    throw UserError("tokenizer '" + source + "': " + what + " is not supported");
  }

  void load_pre_tokenizer(const nlohmann::json& p) {
    if (p.is_null()) return;
    const std::string type = p.value("type", "");
    if (type == "Sequence") {
      for (const nlohmann::json& step : p.at("pretokenizers")) load_pre_tokenizer(step);
    } else if (type == "Split") {
      if (p.value("behavior", "") != "Isolated")
        refuse("Split behavior " + p.value("behavior", ""));
      if (p.value("invert", false)) refuse("Split with invert");
      const nlohmann::json& pattern = p.at("pattern");
      PreStep step;
      if (pattern.contains("Regex")) {
        step.split = std::make_unique<Regex>(pattern["Regex"].get<std::string>(), source);
      } else {
        refuse("Split by a plain string");
      }
      steps.push_back(std::move(step));
    } else if (type == "ByteLevel") {
      PreStep step;
      step.byte_level = true;
      step.prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true))
        step.byte_level_regex = std::make_unique<Regex>(kByteLevelPattern, source);
      steps.push_back(std::move(step));
    } else {
      refuse("pre_tokenizer type '" + type + "'");
    }
  }

  void load_post_processor(const nlohmann::json& p) {
    if (p.is_null()) return;
    const std::string type = p.value("type", "");
    if (type == "Sequence") {
      for (const nlohmann::json& step : p.at("processors")) load_post_processor(step);
    } else if (type == "TemplateProcessing") {
      bool after = false;
      for (const nlohmann::json& piece : p.at("single")) {
        if (piece.contains("Sequence")) {
          after = true;
          continue;
        }
        const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
        for (const nlohmann::json& id : p.at("special_tokens").at(name).at("ids"))
          (after ? suffix : prefix).push_back(id.get<int64_t>());
      }
    } else if (type != "ByteLevel") {  // ByteLevel only adjusts offsets
      refuse("post_processor type '" + type + "'");
    }
  }

  // BPE of one pre-token already mapped to byte characters.
  void bpe(const std::string& word, std::vector<int64_t>& out) const {
    if (auto hit = cache.find(word); hit != cache.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
    std::vector<int64_t> ids;
    auto whole = vocab.find(word);
    if (ignore_merges && whole != vocab.end()) {
      ids.push_back(whole->second);
    } else {
      std::vector<std::string> symbols;  // one UTF-8 character each to start with
      for (size_t i = 0; i < word.size();) {
        size_t len = 1;
        while (i + len < word.size() && (uint8_t(word[i + len]) & 0xC0) == 0x80) ++len;
        symbols.push_back(word.substr(i, len));
        i += len;
      }
      while (symbols.size() > 1) {  // the lowest-ranked pair, leftmost among equals
        int best = INT_MAX;
        size_t at = 0;
        for (size_t i = 0; i + 1 < symbols.size(); ++i) {
          auto it = ranks.find(symbols[i] + " " + symbols[i + 1]);
          if (it != ranks.end() && it->second < best) best = it->second, at = i;
        }
        if (best == INT_MAX) break;
        symbols[at] += symbols[at + 1];
        symbols.erase(symbols.begin() + long(at) + 1);
      }
      for (const std::string& s : symbols) {
        auto it = vocab.find(s);
        if (it == vocab.end())
          throw UserError("tokenizer '" + source + "': symbol '" + s +
                          "' is not in the vocabulary");
        ids.push_back(it->second);
      }
    }
    out.insert(out.end(), ids.begin(), ids.end());
    if (cache.size() < (1u << 20)) cache.emplace(word, std::move(ids));
  }

  // Pre-tokenizes and encodes a stretch of text holding no added token.
  void encode_plain(std::string_view text, std::vector<int64_t>& out) const {
    std::vector<std::string> pieces = {nfc ? nfc_normalize(text) : std::string(text)};
    bool mapped = false;
    for (const PreStep& step : steps) {
      std::vector<std::string> next;
      for (std::string& piece : pieces) {
        std::string_view view = piece;
        std::string prefixed;
        if (step.byte_level && step.prefix_space && !piece.empty() && piece[0] != ' ') {
          prefixed = " " + piece;
          view = prefixed;
        }
        std::vector<std::string_view> parts;
        const Regex* regex = step.split ? step.split.get() : step.byte_level_regex.get();
        if (regex)
          regex->split(view, parts);
        else
          parts.push_back(view);
        for (std::string_view part : parts) next.emplace_back(part);
      }
      pieces = std::move(next);
      mapped = mapped || step.byte_level;
    }
    for (const std::string& piece : pieces) {
      if (piece.empty()) continue;
      std::string word;
      for (unsigned char b : piece) word += bytes[b];  // every byte, as byte-level BPE does
      bpe(word, out);
    }
    (void)mapped;
  }
};

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  const fs::path file = fs::is_directory(path) ? fs::path(path) / "tokenizer.json" : fs::path(path);
  auto impl = std::make_unique<Impl>();
  impl->source = file.string();
  const nlohmann::json j = read_json(file);
  try {
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      const std::string type = j["normalizer"].value("type", "");
      if (type != "NFC") impl->refuse("normalizer '" + type + "'");
      impl->nfc = true;  // Qwen2
    }
    const nlohmann::json& model = j.at("model");
    if (model.value("type", "BPE") != "BPE")
      impl->refuse("model type '" + model.value("type", "") + "'");
    if (model.value("byte_fallback", false))
      impl->refuse("byte_fallback (SentencePiece-style BPE)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"})
      if (model.contains(key) && !model[key].is_null()) impl->refuse(std::string("model.") + key);
    impl->ignore_merges = model.value("ignore_merges", false);
    for (auto it = model.at("vocab").begin(); it != model.at("vocab").end(); ++it) {
      impl->vocab[it.key()] = it.value().get<int64_t>();
      impl->vocab_size = std::max(impl->vocab_size, it.value().get<int64_t>() + 1);
    }
    int rank = 0;
    for (const nlohmann::json& merge : model.at("merges")) {
      std::string key;
      if (merge.is_string()) {
        key = merge.get<std::string>();
      } else {
        key = merge.at(0).get<std::string>() + " " + merge.at(1).get<std::string>();
      }
      impl->ranks.emplace(std::move(key), rank++);
    }
    for (const nlohmann::json& t : j.value("added_tokens", nlohmann::json::array())) {
      for (const char* flag : {"lstrip", "rstrip", "single_word"})
        if (t.value(flag, false)) impl->refuse(std::string("added token ") + flag);
      const int64_t id = t.at("id").get<int64_t>();
      impl->added.push_back({t.at("content").get<std::string>(), id});
      impl->vocab_size = std::max(impl->vocab_size, id + 1);
    }
    std::sort(impl->added.begin(), impl->added.end(), [](const AddedToken& a, const AddedToken& b) {
      return a.content.size() > b.content.size();
    });
    impl->load_pre_tokenizer(j.value("pre_tokenizer", nlohmann::json()));
    impl->load_post_processor(j.value("post_processor", nlohmann::json()));
  } catch (const nlohmann::json::exception& e) {
    throw UserError("tokenizer '" + file.string() + "': unexpected structure (" + e.what() + ")");
  }
  const fs::path config = file.parent_path() / "tokenizer_config.json";
  if (fs::is_regular_file(config)) {
    const nlohmann::json c = read_json(config);
    if (c.contains("eos_token")) {
      const nlohmann::json& e = c["eos_token"];
      const std::string name = e.is_string() ? e.get<std::string>() : e.value("content", "");
      for (const AddedToken& t : impl->added)
        if (t.content == name) impl->eos = t.id;
    }
  }
  return BpeTokenizer(std::move(impl));
}

std::vector<int64_t> BpeTokenizer::encode(std::string_view raw, bool add_special_tokens) const {
  const Impl& m = *impl_;
  const std::string text = utf8_lossy(raw);
  std::vector<int64_t> out;
  if (add_special_tokens) out = m.prefix;
  size_t plain_start = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* found = nullptr;
    for (const AddedToken& t : m.added)  // longest first
      if (!t.content.empty() && text.compare(i, t.content.size(), t.content) == 0) {
        found = &t;
        break;
      }
    if (!found) {
      ++i;
      continue;
    }
    if (i > plain_start)
      m.encode_plain(std::string_view(text).substr(plain_start, i - plain_start), out);
    out.push_back(found->id);
    i += found->content.size();
    plain_start = i;
  }
  if (plain_start < text.size()) m.encode_plain(std::string_view(text).substr(plain_start), out);
  if (add_special_tokens) out.insert(out.end(), m.suffix.begin(), m.suffix.end());
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  if (m.id_to_token.empty()) {  // built on first use: encoding never needs it
    m.id_to_token.assign(size_t(m.vocab_size), {});
    for (const auto& [token, id] : m.vocab) m.id_to_token[size_t(id)] = token;
    for (const AddedToken& a : m.added) {
      m.id_to_token[size_t(a.id)] = a.content;
      m.special.insert(a.id);
    }
    for (int b = 0; b < 256; ++b) m.byte_of[m.bytes[size_t(b)]] = char(b);
  }
  std::string out;
  for (int64_t id : ids) {
    if (id < 0 || id >= m.vocab_size) continue;
    const std::string& token = m.id_to_token[size_t(id)];
    if (m.special.count(id)) {  // added tokens are literal text, not byte characters
      if (!skip_special_tokens) out += token;
      continue;
    }
    // Each UTF-8 character of a vocabulary entry stands for one byte (GPT-2's byte map).
    for (size_t i = 0; i < token.size();) {
      size_t len = 1;
      const unsigned char lead = static_cast<unsigned char>(token[i]);
      if (lead >= 0xF0)
        len = 4;
      else if (lead >= 0xE0)
        len = 3;
      else if (lead >= 0xC0)
        len = 2;
      auto it = m.byte_of.find(token.substr(i, len));
      if (it != m.byte_of.end()) out.push_back(it->second);
      i += len;
    }
  }
  return out;
}

int64_t BpeTokenizer::vocab_size() const {
  return impl_->vocab_size;
}
std::optional<int64_t> BpeTokenizer::eos_id() const {
  return impl_->eos;
}

}  // namespace retort::engine
