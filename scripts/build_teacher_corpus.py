"""Build the embedded corpus of text the default teacher wrote itself (``teacher_generated``).

    python scripts/build_teacher_corpus.py --out lightning_kd/data/corpus/smollm2_generated.jsonl.gz

SmolLM2-135M-Instruct answers seeded requests — a writing task about a topic, drawn from the
lists below across everyday life, science, history, the arts, work, nature and more — sampled at
temperature 1 with nucleus 0.95, up to ``--max-new-tokens`` tokens each. What the student learns
from this text is the teacher's own general English, which a narrow technical corpus never shows
it. The prompts are not part of the text: each record holds the answer alone, plus the prompt
for reference. Deterministic for a given seed, batch size, torch build and CPU kind (sampling
happens in fp32 on the CPU).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_kd.models.sources import SMOLLM2, teacher_dir

TASKS = (
    "Write a short story about {topic}.",
    "Explain {topic} to a curious teenager.",
    "Write a newspaper article about {topic}.",
    "Write a letter to a friend about {topic}.",
    "Describe {topic} in vivid detail.",
    "Write a short essay on {topic}.",
    "Write a dialogue between two people discussing {topic}.",
    "Give practical advice about {topic}.",
    "Write a diary entry about {topic}.",
    "Write an encyclopedia entry about {topic}.",
    "Tell the history of {topic}.",
    "Write a speech about {topic}.",
)

TOPICS = (
    # everyday life
    "cooking a family dinner",
    "moving to a new city",
    "learning to ride a bicycle",
    "a rainy Sunday afternoon",
    "keeping a small garden",
    "a visit to the dentist",
    "planning a wedding",
    "raising a puppy",
    "a long train journey",
    "saving money",
    "a neighbourhood market",
    "the first day at a new job",
    "grandparents",
    "a power cut",
    "cleaning out an attic",
    "a birthday party",
    "commuting by bus",
    "a lost wallet",
    # nature and science
    "volcanoes",
    "the water cycle",
    "honey bees",
    "black holes",
    "the human heart",
    "photosynthesis",
    "earthquakes",
    "the migration of birds",
    "coral reefs",
    "the Moon",
    "vaccines",
    "electricity",
    "dinosaurs",
    "the weather",
    "rainforests",
    "glaciers",
    "the immune system",
    "sleep",
    "mushrooms",
    "whales",
    "the solar system",
    "deserts",
    "climate change",
    "genetics",
    "the ocean tides",
    "antibiotics",
    # history and society
    "the Roman Empire",
    "the invention of the printing press",
    "ancient Egypt",
    "the industrial revolution",
    "the history of the bicycle",
    "the Silk Road",
    "medieval castles",
    "the first moon landing",
    "the history of money",
    "democracy",
    "the invention of the telephone",
    "public libraries",
    "the Olympic Games",
    "the history of tea",
    "trade unions",
    "the founding of a small town",
    "the Vikings",
    # arts and culture
    "learning the piano",
    "a famous painting",
    "jazz music",
    "writing poetry",
    "a theatre performance",
    "photography",
    "folk tales",
    "film making",
    "dance",
    "architecture of old cathedrals",
    "knitting",
    "a museum visit",
    "comic books",
    # work, economy, technology
    "running a small bakery",
    "farming in winter",
    "the life of a nurse",
    "how a bridge is built",
    "fishing boats",
    "the job of a firefighter",
    "shipping ports",
    "a carpenter's workshop",
    "the postal service",
    "electric cars",
    "the internet",
    "smartphones",
    "robots in factories",
    "recycling",
    "renewable energy",
    # sport, travel, places
    "a football match",
    "climbing a mountain",
    "marathon running",
    "a chess tournament",
    "a trip to Japan",
    "Paris in spring",
    "a small fishing village",
    "the Amazon river",
    "camping in the woods",
    "the Sahara desert",
    "an island in the Pacific",
    "London",
    # people, ideas, feelings
    "friendship",
    "courage",
    "forgiveness",
    "honesty",
    "growing old",
    "homesickness",
    "a difficult decision",
    "kindness to strangers",
    "learning a new language",
    "a teacher who changed a life",
    "being a twin",
    "patience",
    "curiosity",
)


def requests(count: int, seed: int) -> list[str]:
    """``count`` seeded task/topic pairs, each pair at most once while any is unused."""
    rng = random.Random(seed)
    pairs = [task.format(topic=topic) for task in TASKS for topic in TOPICS]
    rng.shuffle(pairs)
    return [pairs[i % len(pairs)] for i in range(count)]


@torch.no_grad()
def generate(args: argparse.Namespace) -> None:
    path = teacher_dir(SMOLLM2)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"  # batched generation continues every row at the end
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    torch.manual_seed(args.seed)
    prompts = requests(args.count, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    start, tokens = time.perf_counter(), 0
    with gzip.open(args.out, "wt", encoding="utf-8") as handle:
        for first in range(0, len(prompts), args.batch_size):
            batch = prompts[first : first + args.batch_size]
            chats = [
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
                )
                for p in batch
            ]
            inputs = tokenizer(chats, return_tensors="pt", padding=True, add_special_tokens=False)
            output = model.generate(
                **inputs,
                do_sample=True,
                temperature=1.0,
                top_p=0.95,
                max_new_tokens=args.max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
            answers = output[:, inputs["input_ids"].shape[1] :]
            for prompt, ids in zip(batch, answers, strict=True):
                text = tokenizer.decode(ids, skip_special_tokens=True).strip()
                tokens += int((ids != tokenizer.pad_token_id).sum())
                if text:
                    handle.write(json.dumps({"prompt": prompt, "text": text}) + "\n")
            rate = tokens / (time.perf_counter() - start)
            print(f"{first + len(batch)}/{len(prompts)} answers, {tokens} tokens, {rate:.0f} tok/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--count", type=int, default=640, help="answers to generate")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    generate(parser.parse_args())


if __name__ == "__main__":
    main()
