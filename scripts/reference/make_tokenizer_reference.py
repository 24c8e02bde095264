#!/usr/bin/env python3
"""Reference token ids for lazykv's byte-level BPE tokenizer, from Hugging Face `tokenizers`.

Writes into tests/data/tokenizer/:
  smollm2/tokenizer.json, smollm2/tokenizer_config.json  SmolLM2's tokenizer, built from the GGUF
  smollm2_reference.jsonl   {"text", "ids"} per corpus string, SmolLM2 pre-tokenizer
  qwen2_reference.jsonl     {"text", "ids"}, Qwen2's normalizer + pre-tokenizer over the same vocab
  llama3_reference.jsonl    {"text", "ids"}, Llama-3's pre-tokenizer and BPE ignore_merges, same vocab

(a) SmolLM2. transformers can load a tokenizer from a GGUF, but for tokenizer.ggml.pre = "smollm" it
    builds a plain ByteLevel(use_regex=true) pre-tokenizer, without the Digits(individual_digits=true)
    step of SmolLM2's published tokenizer.json. So the tokenizers.Tokenizer is constructed here from the
    GGUF vocab/merges with exactly the published pre-tokenizer:
      Sequence[Digits(individual_digits=true), ByteLevel(add_prefix_space=false, use_regex=true)]
(b) Qwen2. No Qwen2 vocabulary is available offline, so Qwen2's exact normalizer and pre-tokenizer
      normalizer NFC; Sequence[Split(qwen2 regex, Isolated), ByteLevel(add_prefix_space=false, use_regex=false)]
    are put over the SmolLM2 vocab/merges: the regex and NFC behaviour are what is being checked.
    Its tokenizer.json is not written (it would duplicate SmolLM2's 2 MB vocab); the C++ test loads
    smollm2/tokenizer.json and switches the pre-tokenizer to "qwen2".
(c) Llama-3, likewise: Sequence[Split(llama-3 regex, Isolated), ByteLevel(use_regex=false)] and a BPE
    model with ignore_merges=true (a piece that is a whole token is not merged), as in Llama-3's
    tokenizer.json; the C++ test switches the pre-tokenizer to "llama-bpe".

Token ids never include BOS (add_special_tokens=False); special tokens in the text are parsed.

Run: /tmp/refvenv/bin/python scripts/reference/make_tokenizer_reference.py
"""
import argparse
import json
import os
import sys

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_GGUF = os.path.expanduser("~/.cache/lazykv/models/SmolLM2-135M-Instruct.Q4_1.gguf")
OUT_DIR = os.path.join(REPO, "tests", "data", "tokenizer")
GSM8K = "/work/shared/datasets/gsm8k_test.jsonl"
MAX_JSON_BYTES = 3 * 1024 * 1024

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

GGUF_CONTROL = 3
GGUF_USER_DEFINED = 4


def read_gguf_tokenizer(path):
    reader = gguf.GGUFReader(path)

    def strings(key):
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    def ints(key):
        field = reader.fields[key]
        return [int(field.parts[i][0]) for i in field.data]

    def scalar(key):
        field = reader.fields.get(key)
        if field is None:
            return None
        value = field.parts[field.data[0]]
        if field.types[0] == gguf.GGUFValueType.STRING:
            return bytes(value).decode("utf-8")
        return value[0].item()

    assert scalar("tokenizer.ggml.model") == "gpt2", "only byte-level BPE (gpt2) is handled"
    return {
        "pre": scalar("tokenizer.ggml.pre"),
        "tokens": strings("tokenizer.ggml.tokens"),
        "token_types": ints("tokenizer.ggml.token_type"),
        "merges": strings("tokenizer.ggml.merges"),
        "bos_id": scalar("tokenizer.ggml.bos_token_id"),
        "eos_id": scalar("tokenizer.ggml.eos_token_id"),
        "add_bos": bool(scalar("tokenizer.ggml.add_bos_token") or False),
        "chat_template": scalar("tokenizer.chat_template"),
    }


def build_tokenizer(spec, normalizer, pre_tokenizer, ignore_merges=False):
    vocab = {text: i for i, text in enumerate(spec["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in spec["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                               fuse_unk=False, byte_fallback=False, ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(spec["tokens"][i], special=True, normalized=False)
                for i, t in enumerate(spec["token_types"]) if t == GGUF_CONTROL]
    users = [AddedToken(spec["tokens"][i], special=False, normalized=False)
             for i, t in enumerate(spec["token_types"]) if t == GGUF_USER_DEFINED]
    tok.add_special_tokens(specials)
    if users:
        tok.add_tokens(users)
    for token in specials + users:  # added tokens must keep their GGUF ids
        assert tok.token_to_id(token.content) == spec["tokens"].index(token.content)
    return tok


def smollm2_pre_tokenizer():
    return pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])


def qwen2_pre_tokenizer():
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def llama3_pre_tokenizer():
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def hand_written_cases():
    cases = [
        "",
        " ",
        "  ",
        "a",
        "Hello",
        "Hello world",
        " Hello world",
        "Hello, world! How are you today?",
        "hello   world",
        "trailing spaces   ",
        "   leading spaces",
        "tab\tseparated\tvalues",
        "\t\t\tindented with tabs",
        "mixed \t \t whitespace",
        "line one\nline two",
        "para one\n\npara two",
        "three\n\n\nnewlines",
        "windows\r\nline\r\nendings\r\n",
        "\r\n\r\n",
        "\n",
        "\n\n\n\n",
        " \n \n ",
        "spaces before newline   \nnext",
        "text\n   indented after newline",
        "\u00a0non-breaking\u00a0space",
        "ideographic\u3000space",
        "vertical\x0btab and form\x0cfeed",
        "next\u0085line and line\u2028separator",
        # digits
        "0",
        "12",
        "123",
        "1234",
        "12345678901234567890",
        "3.14159265358979",
        "1,000,000 dollars",
        "x = 42 + 17 - 3 * 8 / 2",
        "The year 2024 had 366 days.",
        " 7 apples and 12 pears",
        "phone: +1 (555) 123-4567",
        "v1.2.3-rc4",
        "0x1F 0b1010 1e-9",
        "Arabic-Indic digits \u0661\u0662\u0663 and superscript \u00b2\u00b3 and roman \u2167",
        "fullwidth \uff11\uff12\uff13",
        "<<16-3-4=9>>9 eggs",
        # contractions
        "it's don't we're they've I'm you'll he'd",
        "IT'S DON'T WE'RE THEY'VE I'M YOU'LL HE'D",
        "It'S We'Re You'Ll",
        "the dog's bone 'LL 'll 's",
        "rock 'n' roll",
        "''quoted''",
        "\u2019curly\u2019 apostrophe isn\u2019t ascii",
        # punctuation
        "Wait... what?!?!",
        "email@example.com https://example.org/path?q=1&r=2#frag",
        "(parentheses) [brackets] {braces} <angles>",
        "--- *** ___ ~~~ ```",
        "$100 \u20ac200 \u00a3300 \u00a5400",
        "50% off!!!",
        # accents, combining marks, NFC vs NFD
        "caf\u00e9",
        "cafe\u0301",
        "na\u00efve r\u00e9sum\u00e9 fa\u00e7ade",
        "nai\u0308ve re\u0301sume\u0301 fac\u0327ade",
        "\u00c5ngstr\u00f6m",
        "A\u030angstro\u0308m",
        "\u212b (angstrom sign) and \u2126 (ohm sign)",
        "\u1e9b\u0323 dot",
        "Stra\u00dfe Gr\u00fc\u00dfe",
        "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
        "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430?",
        "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
        "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01",
        "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dalgo",
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
        "\u1112\u1161\u11ab\u1100\u116e\u11a8",  # Hangul jamo (NFC composes them)
        # CJK
        "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
        "\u6211\u7231\u5317\u4eac\u5929\u5b89\u95e8",
        "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002",
        "\u30ab\u30bf\u30ab\u30ca and \u3072\u3089\u304c\u306a mixed with English",
        "\u6570\u5b66\u95ee\u9898\uff1a3\u4e2a\u82f9\u679c\u52a05\u4e2a\u82f9\u679c\u7b49\u4e8e8\u4e2a\u3002",
        "\U00020000\U0002a6d6 extension B",
        # emoji
        "\U0001f600",
        "I love pizza \U0001f355\U0001f355!",
        "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family",
        "\U0001f3f3\ufe0f\u200d\U0001f308 flag",
        "\U0001f44d\U0001f3fd thumbs up with skin tone",
        "\U0001f1fa\U0001f1f8\U0001f1ef\U0001f1f5 flags",
        "keycap 1\ufe0f\u20e3 #\ufe0f\u20e3",
        "\u2764\ufe0f heart \u2728 sparkles",
        "\U0001f9d1\u200d\U0001f4bb coding \U0001f680\U0001f680\U0001f680",
        # code
        "def add(a, b):\n    return a + b\n",
        "for i in range(10):\n\tprint(i ** 2)\n",
        "#include <stdio.h>\n\nint main(void) {\n    printf(\"Hello, %s!\\n\", \"world\");\n    return 0;\n}\n",
        "std::vector<int32_t> v{1, 2, 3};\nfor (auto& x : v) x *= 2;",
        "fn main() {\n    let s: &str = \"hi\";\n    println!(\"{s}\");\n}",
        "const f = (x) => x?.y ?? 0; // arrow\n",
        "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
        "<div class=\"main\">\n  <p>Text &amp; more</p>\n</div>",
        "{\"key\": [1, 2, {\"nested\": null}], \"ok\": true}",
        "if [ -f \"$FILE\" ]; then\n  echo \"exists\" >&2\nfi",
        "    # four-space indented comment\n        deeper",
        "x=1;y=2;z=x+y",
        "a_b_c __init__ CamelCaseName snake_case_name",
        "$$\\frac{a}{b} = \\sqrt{x^2 + y^2}$$",
        # special tokens inside text
        "<|im_start|>user\nhi<|im_end|>",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>",
        "text<|endoftext|>more text",
        "<|im_end|><|im_end|>",
        "<|im_start|><|im_end|>",
        "  <|im_start|>  spaced  <|im_end|>  ",
        "<|im_start",
        "<|im_end|",
        "<|unknown_token|>",
        "<repo_name>lazykv<file_sep>main.cc<filename>",
        "almost special <|im_start |>",
        "<<|im_start|>>",
        # misc
        "A" * 200,
        "ab" * 100,
        " " * 50 + "x",
        "x" + "\n" * 20,
        "1" * 64,
        "!!!???...,,,;;;",
        "a.b.c.d.e.f",
        "\u00bfQu\u00e9 tal? \u00a1Muy bien!",
        "Ol\u00e1, tudo bem? S\u00e3o Paulo \u00e9 grande.",
        "\u00c7a va tr\u00e8s bien, merci \u00e0 vous.",
        "Mixed \u4e2d\u6587 and English and \u0440\u0443\u0441\u0441\u043a\u0438\u0439 text 123.",
        "\u0000nul and \u0001 control \u007f chars",
        "soft\u00adhyphen zero\u200bwidth space",
        "\ufeffBOM at start",
        "math \u2211 \u222b \u221e \u2248 \u2260 \u2264 \u2265 \u00b1 \u00d7 \u00f7",
        "arrows \u2190 \u2191 \u2192 \u2193 \u21d2",
        "\ufb01 ligature and \u2460 circled",
        # characters whose bytes have no token in SmolLM2's vocabulary (dropped, no unk token)
        "a\x04b\x13\x14c",
        "plane 4 \U00040000 and plane 9 \U00090000 chars",
    ]
    return cases


def corpus():
    texts = []
    with open(GSM8K, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    texts += [row["question"] for row in rows[:200]]
    texts += [row["answer"] for row in rows[:20]]  # <<a*b=c>> arithmetic and "#### n" lines
    texts += hand_written_cases()
    return texts


def bytes_without_token(tok):
    """Bytes whose byte-level character is not in the vocabulary (BPE drops them: no unk token)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    code_point = {b: b for b in printable} | {b: 256 + i for i, b in enumerate(shifted)}
    vocab = tok.get_vocab()
    return {b for b in range(256) if chr(code_point[b]) not in vocab}


def write_reference(path, tok, texts, check_round_trip):
    missing = bytes_without_token(tok)
    with open(path, "w", encoding="utf-8") as f:
        for text in texts:
            ids = tok.encode(text, add_special_tokens=False).ids
            # Byte-level BPE without a normalizer loses nothing, unless a byte has no token.
            if check_round_trip and not missing.intersection(text.encode("utf-8")):
                assert tok.decode(ids, skip_special_tokens=False) == text, text
            f.write(json.dumps({"text": text, "ids": ids}, ensure_ascii=False) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=DEFAULT_GGUF)
    args = parser.parse_args()

    spec = read_gguf_tokenizer(args.gguf)
    assert spec["pre"] == "smollm", spec["pre"]
    texts = corpus()
    assert len(texts) >= 300, len(texts)

    smollm2 = build_tokenizer(spec, None, smollm2_pre_tokenizer())
    qwen2 = build_tokenizer(spec, normalizers.NFC(), qwen2_pre_tokenizer())
    llama3 = build_tokenizer(spec, None, llama3_pre_tokenizer(), ignore_merges=True)

    os.makedirs(os.path.join(OUT_DIR, "smollm2"), exist_ok=True)
    json_path = os.path.join(OUT_DIR, "smollm2", "tokenizer.json")
    smollm2.save(json_path, pretty=False)
    size = os.path.getsize(json_path)
    if size >= MAX_JSON_BYTES:
        os.remove(json_path)
        sys.exit(f"smollm2 tokenizer.json is {size} bytes, over the 3 MB limit")
    config = {
        "add_bos_token": spec["add_bos"],
        "bos_token": spec["tokens"][spec["bos_id"]],
        "eos_token": spec["tokens"][spec["eos_id"]],
        "chat_template": spec["chat_template"],
    }
    with open(os.path.join(OUT_DIR, "smollm2", "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
        f.write("\n")

    # The saved file must reproduce the same ids when read back by `tokenizers`.
    reloaded = Tokenizer.from_file(json_path)
    for text in texts:
        assert reloaded.encode(text, add_special_tokens=False).ids == \
            smollm2.encode(text, add_special_tokens=False).ids, text

    write_reference(os.path.join(OUT_DIR, "smollm2_reference.jsonl"), smollm2, texts, True)
    write_reference(os.path.join(OUT_DIR, "qwen2_reference.jsonl"), qwen2, texts, False)
    write_reference(os.path.join(OUT_DIR, "llama3_reference.jsonl"), llama3, texts, True)
    print(f"{len(texts)} strings; smollm2 tokenizer.json {size} bytes")


if __name__ == "__main__":
    main()
