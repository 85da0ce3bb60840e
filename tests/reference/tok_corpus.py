#!/usr/bin/env python3
"""tok_corpus.py - build the tokenizer test corpus (tests/golden/text/tok_corpus.bin.xz).

The corpus is license-clean by construction:
  * Alessandro Manzoni, "I Promessi Sposi" (public domain: Project Gutenberg
    ebook #45334 without its header and footer, given by --manzoni), split
    into chapters;
  * this repository's own C sources as code samples;
  * text generated here from word lists written for this script: English,
    Italian, Korean, Chinese and Japanese sentences, emoji, numbers in many
    scripts, long whitespace and digit runs;
  * random Unicode strings over all planes (combining marks, unusual digits,
    ZWJ sequences, unassigned and private-use code points);
  * strings embedding the special-token spellings, for transcript mode;
  * a few invalid UTF-8 byte strings (tokenized by ds4's own rule, see
    src/text/tokenizer.h; HF cannot take them).

Format: for each document, a header line "#doc <name> <nbytes>\\n", the raw
bytes, then "\\n".  Deterministic (fixed seed): rerunning gives the same file.

Usage: tests/reference/tok_corpus.py --manzoni PATH [--out PATH]
"""
import argparse
import glob
import lzma
import os
import random

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))

EN = ("the of and to in is was that for on with as by at from his her they this which but not are be had "
      "have were been one all would there their what so if about out up into time more when can only new "
      "some could them other than then now look first also after use two how our work well way even want "
      "because any these give day most us model token engine memory cache server request stream kernel "
      "weights matrix vector attention layer expert router tool call answer question reason context").split()
IT = ("il la di che e un una per non con si del della le gli lo da in come più ma anche questo quella "
      "sono era fu ha hanno essere stato casa tempo giorno notte strada paese città acqua fuoco cuore "
      "perché però già così ancora sempre mai nulla tutto ciascuno però dunque allora qualcosa").split()
KO = ("안녕하세요 감사합니다 사람 시간 오늘 내일 학교 회사 컴퓨터 프로그램 모델 데이터 서버 질문 대답 "
      "우리는 그리고 하지만 그래서 정말 아주 많이 조금 먹다 가다 오다 보다 하다 있다 없다 좋다 나쁘다 "
      "한국어 문장 토큰 캐시 메모리 계산 결과 문제 해결 방법 생각 이야기 사랑 친구 가족 도시 바다").split()
ZH = ("我们 你们 他们 今天 明天 昨天 学校 公司 电脑 程序 模型 数据 服务器 问题 回答 因为 所以 但是 "
      "非常 一些 很多 时间 地方 城市 国家 世界 中国 北京 上海 广州 天气 温度 下雨 晴天 朋友 家人 "
      "工作 学习 研究 计算 结果 方法 思考 语言 文字 词语 句子 标记 缓存 内存 推理 注意力 专家").split()
JA = ("私は あなた 今日 明日 学校 会社 コンピュータ プログラム モデル データ サーバー 質問 答え "
      "ですが そして しかし とても 少し たくさん 時間 場所 東京 大阪 天気 友達 家族 仕事 勉強 研究 "
      "計算 結果 方法 考える 言語 文字 単語 文章 トークン キャッシュ メモリ 推論 注目 ひらがな カタカナ").split()
EMOJI = ["😀", "🚀", "👍🏽", "❤️", "🇮🇹", "🇰🇷", "👨‍👩‍👧‍👦", "🧑🏿‍💻", "🏳️‍🌈", "✅", "🦙", "😶‍🌫️", "1️⃣", "©️",
         "🤖", "🎉", "🙏", "🔥", "💡", "⭐"]
DIGIT_ZEROS = [0x30, 0x660, 0x6F0, 0x7C0, 0x966, 0x9E6, 0xA66, 0xAE6, 0xB66, 0xBE6, 0xC66, 0xCE6, 0xD66,
               0xE50, 0xED0, 0xF20, 0x1040, 0x17E0, 0x1810, 0xFF10, 0x1D7CE, 0x104A0, 0x11066]
OTHER_NUMBERS = "²³¹¼½¾ⅠⅡⅢⅣⅤⅫⅰⅱ①②③⑩⑳⓵❶〇一二三十百千万亿𝟘𝟙𝟚"
COMBINING = [chr(c) for c in list(range(0x300, 0x370)) + list(range(0x1AB0, 0x1AC0)) + list(range(0x20D0, 0x20F1))]
SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>",
            "</think>", "｜DSML｜", "<｜latest_reminder｜>", "<｜action｜>", "<｜fim▁hole｜>", "<dsml:",
            "</dsml:", "<｜/table>｜", "<|EOT|>", "<｜place▁holder▁no▁17｜>"]


def sentence(rng, words, sep=" ", end="."):
    n = rng.randint(4, 16)
    s = sep.join(rng.choice(words) for _ in range(n))
    return s[0].upper() + s[1:] + end if sep == " " else s + end


def number(rng):
    k = rng.random()
    if k < 0.4:
        return str(rng.randint(0, 10 ** rng.randint(1, 12)))
    if k < 0.6:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 6)}f}"
    if k < 0.8:
        z = rng.choice(DIGIT_ZEROS)
        return "".join(chr(z + int(d)) for d in str(rng.randint(0, 10 ** rng.randint(1, 9))))
    return "".join(rng.choice(OTHER_NUMBERS) for _ in range(rng.randint(1, 6)))


def mixed_paragraph(rng):
    parts = []
    for _ in range(rng.randint(3, 9)):
        lang = rng.choice(["en", "it", "ko", "zh", "ja", "mix"])
        if lang == "en":
            parts.append(sentence(rng, EN))
        elif lang == "it":
            parts.append(sentence(rng, IT, end=rng.choice([".", "!", "?", "…", ";"])))
        elif lang == "ko":
            parts.append(sentence(rng, KO, end=rng.choice([".", "?", "!"])))
        elif lang == "zh":
            parts.append(sentence(rng, ZH, sep=rng.choice(["", "，", "、"]), end=rng.choice(["。", "！", "？"])))
        elif lang == "ja":
            parts.append(sentence(rng, JA, sep=rng.choice(["", "、"]), end=rng.choice(["。", "！", "？"])))
        else:
            words = [rng.choice(EN + IT + KO + ZH + JA) for _ in range(rng.randint(3, 10))]
            words.insert(rng.randrange(len(words)), number(rng))
            words.insert(rng.randrange(len(words)), rng.choice(EMOJI))
            parts.append(" ".join(words) + rng.choice([".", " 😀", "!!", "?!", "...", " —", "」"]))
    return rng.choice([" ", "  ", "\n", " "]).join(parts)


def generated_text(rng, size):
    out = []
    while sum(len(p) for p in out) < size:
        out.append(mixed_paragraph(rng))
        out.append(rng.choice(["\n\n", "\n", "\r\n", "\n\n\n", "\t\n"]))
    return "".join(out)


def whitespace_and_digits(rng):
    ws = [" ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2003", "\u2028", "\u0085", "\u000b", "\u000c",
          "\u180e", "\u200b", "\ufeff"]
    out = []
    for _ in range(600):
        k = rng.random()
        if k < 0.3:
            out.append("".join(rng.choice(ws) for _ in range(rng.randint(1, 40))))
        elif k < 0.45:
            out.append(" " * rng.choice([1, 2, 3, 4, 8, 16, 33, 100, 1000]))
        elif k < 0.6:
            out.append("".join(rng.choice("0123456789") for _ in range(rng.randint(1, 80))))
        elif k < 0.7:
            out.append(number(rng))
        elif k < 0.85:
            out.append(rng.choice(EN + IT + KO + ZH + JA))
        else:
            out.append(rng.choice(["(", ")", "{", "}", ";", "->", "==", "!=", "...", "—", "«", "»", ".foo",
                                   "_bar", "$x", "#include", "//", "/*", "*/", "'", '"', "`", "~", "@", "%d"]))
    return "".join(out)


def random_codepoint(rng):
    k = rng.random()
    if k < 0.35:
        c = rng.randint(0, 0x2FFFF)
    elif k < 0.55:
        c = rng.randint(0, 0x10FFFF)
    elif k < 0.75:
        c = rng.randint(0x20, 0x7E)
    elif k < 0.85:
        c = rng.randint(0x80, 0x7FF)
    else:
        c = rng.randint(0x800, 0xFFFF)
    if 0xD800 <= c <= 0xDFFF:
        c = 0xFFFD
    return chr(c)


def random_unicode(rng, size):
    out = []
    n = 0
    while n < size:
        k = rng.random()
        if k < 0.5:
            s = "".join(random_codepoint(rng) for _ in range(rng.randint(1, 30)))
        elif k < 0.65:
            base = rng.choice("aeiouAEIOUxyzΩωЖжאבاب가나あア")
            s = base + "".join(rng.choice(COMBINING) for _ in range(rng.randint(1, 8)))
        elif k < 0.8:
            s = "\u200d".join(rng.choice(EMOJI) for _ in range(rng.randint(2, 5)))
        elif k < 0.9:
            s = number(rng) + random_codepoint(rng) + number(rng)
        else:
            s = rng.choice([" ", "\n", "  ", "\t"]) + random_codepoint(rng) * rng.randint(1, 5)
        out.append(s)
        out.append(rng.choice([" ", "", "\n", " \n "]))
        n += len(s.encode()) + 1
    return "".join(out)


def with_specials(rng, size):
    out = []
    n = 0
    while n < size:
        k = rng.random()
        if k < 0.35:
            s = rng.choice(SPECIALS)
        elif k < 0.5:
            sp = rng.choice(SPECIALS)
            cut = rng.randint(1, len(sp) - 1)
            s = sp[:cut] + rng.choice(["", " ", "x"]) + sp[cut:]
        elif k < 0.6:
            s = rng.choice(SPECIALS) + rng.choice(SPECIALS)
        else:
            s = mixed_paragraph(rng)
        out.append(s)
        n += len(s.encode())
    return "".join(out)


def invalid_utf8(rng, size):
    pieces = []
    n = 0
    while n < size:
        k = rng.random()
        if k < 0.3:
            b = bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 8)))
        elif k < 0.5:
            b = rng.choice([b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xff", b"\xfe",
                            b"\xe2\x82", b"\xf0\x9f\x98", b"\x80\x80", b"\xc3", b"\xf8\x88\x80\x80\x80"])
        else:
            b = mixed_paragraph(rng).encode()[: rng.randint(1, 60)]
        pieces.append(b)
        n += len(b)
    return b"".join(pieces)


def documents(manzoni_path):
    rng = random.Random(20260301)
    docs = []
    text = open(manzoni_path, encoding="utf-8").read()
    chapters = text.split("\n\n\n\n")
    for i, ch in enumerate(chapters):
        if ch.strip():
            docs.append((f"manzoni.{i:03d}", ch.encode()))
    for path in sorted(glob.glob(os.path.join(ROOT, "src", "**", "*.[ch]"), recursive=True)):
        docs.append(("code." + os.path.relpath(path, ROOT).replace("/", "."), open(path, "rb").read()))
    for i in range(24):
        docs.append((f"mixed.{i:02d}", generated_text(rng, 10000).encode()))
    for i in range(8):
        docs.append((f"spaces_digits.{i:02d}", whitespace_and_digits(rng).encode()))
    for i in range(24):
        docs.append((f"unicode.{i:02d}", random_unicode(rng, 8000).encode()))
    for i in range(8):
        docs.append((f"specials.{i:02d}", with_specials(rng, 4000).encode()))
    for i in range(6):
        docs.append((f"invalid.{i:02d}", invalid_utf8(rng, 3000)))
    docs.append(("edge.empty", b""))
    docs.append(("edge.long_spaces", b" " * 8000 + b"x" + b"\t" * 3001 + b"y"))
    docs.append(("edge.long_letters", b"a" * 5000 + b" " + "è".encode() * 2000))
    docs.append(("edge.long_digits", b"7" * 3001))
    docs.append(("edge.long_newlines", b"\n" * 3000 + b" \n" * 1000))
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--manzoni", required=True,
                    help="I Promessi Sposi as plain text (Project Gutenberg ebook #45334)")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "text", "tok_corpus.bin.xz"))
    args = ap.parse_args()
    blob = bytearray()
    docs = documents(args.manzoni)
    for name, data in docs:
        blob += f"#doc {name} {len(data)}\n".encode() + data + b"\n"
    with lzma.open(args.out, "wb", preset=9) as f:
        f.write(blob)
    print(f"{args.out}: {len(docs)} documents, {len(blob)} bytes")


if __name__ == "__main__":
    main()
