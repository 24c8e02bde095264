#!/usr/bin/env python3
"""Writes the multi-turn QA set of `lazykv eval conversation`.

Each conversation is a long chat built from consecutive GSM8K test problems:
the user poses a problem, the assistant answers with GSM8K's reference
solution (calculator notes removed, "The answer is N." at the end). Then
questions ask about earlier turns: each quotes the first sentence of one
problem and asks for its final answer, which only the history holds.

The set is deterministic (fixed problems, seeded choice of questions):
    python3 scripts/make_conversations.py \
        --gsm8k ../shared/datasets/gsm8k_test.jsonl \
        --out data/conversation/gsm8k_chats.jsonl
Standard library only.
"""
import argparse
import json
import random
import re

FIRST_PROBLEM = 500  # past the problems `eval accuracy` runs first


def first_sentence(text):
    match = re.match(r"(.+?[.?!])(\s|$)", text.strip(), re.S)
    return (match.group(1) if match else text).strip()


def solution(answer):
    body, final = answer.split("####")
    body = re.sub(r"<<[^>]*>>", "", body).strip()
    return body + "\nThe answer is " + final.strip() + ".", final.strip().replace(",", "")


def conversation(index, problems, n_questions, rng):
    turns = []
    openings = []
    for problem in problems:
        text, _ = solution(problem["answer"])
        turns.append({"role": "user", "content": problem["question"].strip()})
        turns.append({"role": "assistant", "content": text})
        openings.append(first_sentence(problem["question"]))
    # Questions only about problems whose opening sentence is unique here.
    unique = [i for i, s in enumerate(openings) if openings.count(s) == 1]
    questions = []
    for i in sorted(rng.sample(unique, n_questions)):
        _, gold = solution(problems[i]["answer"])
        questions.append({
            "question": 'Earlier in this conversation we solved a problem that begins: "' + openings[i] +
                        '" What was its final answer? Reply with the number only.',
            "answer": gold,
            "turn": 2 * i,
        })
    return {"id": "gsm8k-chat/" + str(index), "turns": turns, "questions": questions}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gsm8k", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--conversations", type=int, default=25)
    parser.add_argument("--problems", type=int, default=10, help="problems (user + assistant turns) per chat")
    parser.add_argument("--questions", type=int, default=4, help="questions per chat")
    args = parser.parse_args()
    with open(args.gsm8k) as f:
        problems = [json.loads(line) for line in f if line.strip()]
    rng = random.Random(0)
    with open(args.out, "w") as out:
        for c in range(args.conversations):
            first = FIRST_PROBLEM + c * args.problems
            chat = conversation(c, problems[first:first + args.problems], args.questions, rng)
            out.write(json.dumps(chat, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
