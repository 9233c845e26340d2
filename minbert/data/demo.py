"""The synthetic demo data of data/demo/ (scripts/make_demo_data.py): the course's four CSV tasks, with the same
file names and formats as the course files, and SQuAD 2.0's files (demo_squad.py).

    write_demo_data(Path("data/demo"), seed=0)

Every sentence is built here from templates and small word lists written for this project, so the
labels are known by construction: SST polarity from the strength of the wording, CFIMDB from the
review's tone, Quora duplicates from paraphrase templates of one question, STS similarity from how
many parts of a described scene (who, doing what, where) two sentences share. The output is deterministic for a
given seed; the committed files come from seed 0 (the SQuAD files draw from their own generator, so they leave the
CSVs unchanged).
"""
from __future__ import annotations

import csv
import hashlib
import io
import random
from pathlib import Path

from minbert.data.demo_squad import write_squad
from minbert.files import atomic_write_text


# Examples per split (train, dev, test) of each course file.
SST_SIZES = QUORA_SIZES = STS_SIZES = (160, 40, 40)
CFIMDB_SIZES = (60, 20, 20)
SPLIT_NAMES = ("train", "dev", "test-student")

# ---- SST: five levels of polarity -------------------------------------------------------------

FILMS = ["The film", "This movie", "The sequel", "The new thriller", "This comedy", "The documentary",
         "The remake", "This romantic drama", "The animated feature", "The war epic", "This horror picture",
         "The musical", "The debut feature", "The courtroom drama", "This family adventure", "The heist caper"]
STRENGTHS = ["the lead performance", "the score", "the photography", "the supporting cast", "the set design",
             "the opening scene", "the final twist", "the costume work"]
FLAWS = ["the middle drags a little", "the ending is easy to guess", "a few jokes fall flat",
         "it runs a bit long", "the villain is thinly written", "the subplot goes nowhere"]
PLOTS = ["a retired teacher who returns to her home town", "two brothers running a failing restaurant",
         "a detective chasing a forger across Europe", "a young swimmer training for a national final",
         "a family that moves to a remote island", "a rock band on its last tour",
         "a nurse working night shifts in a busy hospital", "a chess player preparing for a title match"]

SST_TEMPLATES = {
    0: ["{film} is {very_bad}.", "{film} is {very_bad}, and not even {strength} can save it.",
        "Avoid {film_lower} at all costs; it is {very_bad}.",
        'Calling {film_lower} a "story" is generous: it is {very_bad}.',
        "I have rarely been this bored. {film} is {very_bad}."],
    1: ["{film} is {bad}.", "{strength_cap} is fine, but {film_lower} is {bad}.",
        "Despite {strength}, {film_lower} is {bad}.", "{film} has its moments, yet overall it is {bad}."],
    2: ["{film} follows {plot}.", "{film} tells the story of {plot}.",
        "{film} is about {plot}, and it runs close to two hours.",
        "{film} is neither good nor bad; it is {plain}.", "{film}, which follows {plot}, is {plain}."],
    3: ["{film} is {good}.", "{film} is {good}, even if {flaw}.", "Thanks to {strength}, {film_lower} is {good}.",
        "{film} is {good}, and {strength} stands out."],
    4: ["{film} is {very_good}.", "{film} is {very_good}, and {strength} is unforgettable.",
        "Go and see {film_lower} tonight: it is {very_good}.",
        'Critics will call {film_lower} "essential", and for once they are right: it is {very_good}.'],
}
SST_WORDS = {
    "very_bad": ["a complete disaster", "an unwatchable mess", "painfully bad from start to finish",
                 "a dreadful waste of two hours", "one of the worst films of the year", "insultingly stupid"],
    "bad": ["disappointing", "flat and forgettable", "too long and rarely funny", "clumsy and uneven",
            "mostly tedious", "a missed opportunity"],
    "plain": ["an ordinary piece of work", "competent but unremarkable", "a fairly standard entry in its genre",
              "about what you would expect"],
    "good": ["enjoyable", "charming", "a pleasant surprise", "well acted and often funny", "smart and engaging",
             "warm and likeable"],
    "very_good": ["a masterpiece", "brilliant from start to finish", "one of the best films of the decade",
                  "a stunning achievement", "an absolute joy to watch", "extraordinary"],
}

# ---- CFIMDB: short polar reviews ----------------------------------------------------------------

REVIEW_PARTS = {
    1: {"open": ["I loved this film.", "What a wonderful surprise this movie turned out to be.",
                 "I went in with low expectations and came out delighted.",
                 "This is one of my favourite films of the year.", "My whole family enjoyed this one."],
        "body": ["The acting is superb, especially from the two leads.",
                 "The story moves quickly and never loses its heart.",
                 "Every scene looks beautiful, and the music fits perfectly.",
                 "The dialogue is sharp and often very funny.", "It made me laugh and cry in the same evening.",
                 "The ending is moving without being sentimental."],
        "aside": ["The first ten minutes are a little slow, but that hardly matters.",
                  "A couple of scenes could have been shorter, but I did not mind."],
        "close": ["Highly recommended.", "I will happily watch it again.", "Ten out of ten.",
                  "Go and see it with someone you love."]},
    0: {"open": ["I really wanted to like this movie, but I could not.", "This was a waste of an evening.",
                 "I have seen bad films before, but this one is special.", "What a letdown.",
                 "I cannot understand the good reviews this got."],
        "body": ["The plot makes no sense and the characters are flat.",
                 "The acting is wooden, even from the usually reliable lead.",
                 "Half of the jokes fall flat and the other half are mean.",
                 "The camera shakes so much that I felt sick.", "It is at least forty minutes too long.",
                 "The ending is so silly that people in my row laughed out loud."],
        "aside": ["The soundtrack is decent, but nothing else is.",
                  "One actor tries hard, but the script gives him nothing to do."],
        "close": ["Avoid it.", "One star, and that is generous.", "Save your money.", "I left before the end."]},
}

# ---- Quora: questions with paraphrase templates --------------------------------------------------

QUESTION_FAMILIES = [
    (["How should a complete beginner learn {x}?", "What is a good way for a beginner to pick up {x}?",
      "How can I teach myself {x} from scratch?"],
     ["Python", "the guitar", "Spanish", "chess", "calculus", "photography", "Japanese", "the piano",
      "statistics", "web design"]),
    (["Which sights are worth seeing on a first trip to {x}?", "What should a first-time visitor see in {x}?",
      "What are the must-see places for someone visiting {x} for the first time?"],
     ["Japan", "Paris", "Kenya", "Peru", "Iceland", "New York", "Vietnam", "Portugal"]),
    (["How do I become a {x}?", "What steps should I take to become a {x}?", "What does it take to work as a {x}?"],
     ["data scientist", "pilot", "nurse", "lawyer", "game developer", "chef", "teacher", "architect"]),
    (["What is the difference between {x}?", "How are {x} different?", "In what ways do {x} differ?"],
     ["a virus and a bacterium", "weather and climate", "a loan and a grant", "RAM and storage",
      "a crocodile and an alligator", "speed and velocity", "stocks and bonds"]),
    (["How can I improve my {x} within a few weeks?", "What are quick ways to get better at {x} in a few weeks?",
      "What can I do over the next few weeks to improve my {x}?"],
     ["handwriting", "memory", "public speaking", "sleep", "English writing", "concentration", "posture",
      "cooking"]),
]
FIXED_QUESTIONS = [
    ["Why is the sky blue?", "What makes the sky look blue?"],
    ["Why do cats purr?", "What is the reason cats purr?"],
    ["How many hours of sleep does an adult need?", "How much sleep should a grown-up get each night?"],
    ["Is it safe to drink tap water in Mexico City?", "Can you safely drink the tap water in Mexico City?"],
    ["How do airplanes stay in the air?", "What keeps a plane up while it is flying?"],
    ["How do I stop procrastinating?", "What can I do to stop putting things off?"],
    ["Which laptop is best for college students?", "What is a good laptop for a university student?"],
    ["How do I make friends in a new city?", "What is the best way to meet people after moving to a new city?"],
    ["Can dogs eat chocolate?", "Is chocolate safe for dogs to eat?"],
    ['What does the phrase "break a leg" mean?', 'What is the meaning of "break a leg"?'],
    ["How long does it take to boil an egg?", "How many minutes should I boil an egg for?"],
    ["What is the fastest way to get rid of hiccups?", "How can I stop hiccups quickly?"],
]

# ---- STS: scenes described by (who, doing what, where) -------------------------------------------

WHO = {"man": ["A man in a hat", "A man wearing a hat"],
       "woman": ["A woman in a red coat", "A woman wearing a red coat"],
       "boy": ["A boy in a blue shirt", "A boy wearing a blue shirt"],
       "girl": ["A girl with long hair", "A long-haired girl"],
       "kids": ["Two small children", "Two little kids"],
       "old": ["An old man with a beard", "A bearded old man"],
       "chef": ["A chef in a white apron", "A cook wearing a white apron"],
       "friends": ["Three friends", "Three young friends"]}
DOING = {"guitar": ["is playing a guitar", "is playing the guitar", "is strumming a guitar"],
         "onion": ["is slicing an onion", "is cutting an onion", "is chopping an onion"],
         "bike": ["is riding a bicycle", "is riding a bike"],
         "book": ["is reading a book", "is reading a novel"],
         "ball": ["is kicking a ball", "is kicking a soccer ball"],
         "dance": ["is dancing", "is dancing to music"],
         "pasta": ["is cooking pasta", "is making pasta"],
         "dog": ["is walking a dog", "is taking a dog for a walk"],
         "laptop": ["is typing on a laptop", "is working on a laptop"],
         "swim": ["is swimming", "is swimming laps"],
         "paint": ["is painting a fence", "is putting paint on a fence"],
         "sing": ["is singing a song", "is singing"]}
WHERE = {"park": ["in a park", "at the park"], "stage": ["on a stage", "on stage"],
         "kitchen": ["in a kitchen", "in the kitchen"], "beach": ["on the beach", "at the beach"],
         "street": ["on a busy street", "on a crowded street"], "room": ["in a small room", "inside a small room"],
         "pool": ["in a pool", "in the pool"], "yard": ["in a backyard", "in the backyard"]}
PLACES_FOR = {"guitar": ["park", "stage", "street", "room", "beach"], "onion": ["kitchen"],
              "bike": ["park", "street", "beach"], "book": ["park", "room", "beach"],
              "ball": ["park", "beach", "street", "yard"], "dance": ["stage", "park", "room", "beach", "street"],
              "pasta": ["kitchen"], "dog": ["park", "street", "beach"], "laptop": ["room", "kitchen", "park"],
              "swim": ["pool", "beach"], "paint": ["yard"], "sing": ["stage", "street", "room", "kitchen", "park"]}
# (how the two scenes relate, score range): the more parts two scenes share, the higher the score.
STS_RELATIONS = [("same scene", 4.6, 5.0), ("place on one side only", 3.8, 4.4), ("other place", 3.0, 3.6),
                 ("other person", 2.4, 3.2), ("other activity, same place", 1.4, 2.2),
                 ("other activity", 0.6, 1.4), ("nothing shared", 0.0, 0.4)]


def example_id(name: str, index: int) -> str:
    return hashlib.md5(f"minbert-demo/{name}/{index}".encode()).hexdigest()[:25]


def sst_sentences(rng: random.Random, per_class: int) -> dict[int, list[str]]:
    by_label = {}
    for label, templates in SST_TEMPLATES.items():
        seen: set[str] = set()
        while len(seen) < per_class:
            film = rng.choice(FILMS)
            slots = {"film": film, "film_lower": film[0].lower() + film[1:], "plot": rng.choice(PLOTS),
                     "flaw": rng.choice(FLAWS), "strength": rng.choice(STRENGTHS)}
            slots["strength_cap"] = slots["strength"][0].upper() + slots["strength"][1:]
            slots.update({key: rng.choice(words) for key, words in SST_WORDS.items()})
            seen.add(rng.choice(templates).format(**slots))
        by_label[label] = sorted(seen)
    return by_label


def cfimdb_reviews(rng: random.Random, per_class: int) -> dict[int, list[str]]:
    by_label = {}
    for label, parts in REVIEW_PARTS.items():
        seen: set[str] = set()
        while len(seen) < per_class:
            sentences = [rng.choice(parts["open"]), *rng.sample(parts["body"], rng.randint(1, 2))]
            if rng.random() < 0.3:
                sentences.append(rng.choice(parts["aside"]))
            sentences.append(rng.choice(parts["close"]))
            seen.add(" ".join(sentences))
        by_label[label] = sorted(seen)
    return by_label


def quora_pairs(rng: random.Random, n_duplicates: int, n_distinct: int) -> dict[int, list[tuple[str, str]]]:
    """Duplicates are two phrasings of one question; non-duplicates are two different questions."""
    intents = [(family, [form.format(x=x) for form in forms])
               for family, (forms, fillers) in enumerate(QUESTION_FAMILIES) for x in fillers]
    intents += [(None, forms) for forms in FIXED_QUESTIONS]
    duplicates: set[tuple[str, str]] = set()
    while len(duplicates) < n_duplicates:
        duplicates.add(tuple(rng.sample(rng.choice(intents)[1], 2)))
    distinct: set[tuple[str, str]] = set()
    while len(distinct) < n_distinct:
        family, first = rng.choice(intents)
        # Half of the non-duplicates share the question template but not its subject, like Quora's hard negatives.
        same_family = [forms for f, forms in intents if family is not None and f == family and forms is not first]
        second = rng.choice(same_family) if same_family and rng.random() < 0.5 else rng.choice(intents)[1]
        if second is not first:
            distinct.add((rng.choice(first), rng.choice(second)))
    return {1: sorted(duplicates), 0: sorted(distinct)}


PLURAL_WHO = {"kids", "friends"}


def describe(rng: random.Random, who: str, doing: str, where: str | None) -> str:
    activity = rng.choice(DOING[doing])
    if who in PLURAL_WHO:
        activity = "are" + activity.removeprefix("is")
    place = "" if where is None else " " + rng.choice(WHERE[where])
    return f"{rng.choice(WHO[who])} {activity}{place}."


def sts_pair(rng: random.Random, relation: str) -> tuple[str, str]:
    who = rng.choice(list(WHO))
    if relation == "other place":  # only activities that fit more than one place
        doing = rng.choice([d for d, places in PLACES_FOR.items() if len(places) > 1])
    else:
        doing = rng.choice(list(DOING))
    where = rng.choice(PLACES_FOR[doing])
    other_who = rng.choice([w for w in WHO if w != who])
    other_doing = rng.choice([d for d in DOING if d != doing])
    if relation == "same scene":
        return describe(rng, who, doing, where), describe(rng, who, doing, where)
    if relation == "place on one side only":
        return describe(rng, who, doing, where), describe(rng, who, doing, None)
    if relation == "other place":
        other_where = rng.choice([p for p in PLACES_FOR[doing] if p != where])
        return describe(rng, who, doing, where), describe(rng, who, doing, other_where)
    if relation == "other person":
        return describe(rng, who, doing, where), describe(rng, other_who, doing, where)
    if relation == "other activity, same place":
        shared = [p for p in PLACES_FOR[other_doing] if p in PLACES_FOR[doing]]
        where = rng.choice(shared) if shared else None
        return describe(rng, who, doing, where), describe(rng, who, other_doing, where)
    if relation == "other activity":
        return describe(rng, who, doing, where), describe(rng, who, other_doing, None)
    other_where = rng.choice([p for p in PLACES_FOR[other_doing] if p != where] or [None])
    return describe(rng, who, doing, where), describe(rng, other_who, other_doing, other_where)


def sts_pairs(rng: random.Random, total: int) -> dict[str, list[tuple[str, str, float]]]:
    per_relation = -(-total // len(STS_RELATIONS))
    by_relation = {}
    for relation, low, high in STS_RELATIONS:
        seen: dict[frozenset, tuple[str, str, float]] = {}
        while len(seen) < per_relation:
            first, second = sts_pair(rng, relation)
            if first != second:
                score = round(rng.uniform(low, high) * 5) / 5  # STS-B scores sit on a coarse grid
                seen.setdefault(frozenset((first, second)), (first, second, score))
        by_relation[relation] = sorted(seen.values())
    return by_relation


def split_stratified(rng: random.Random, groups: dict, sizes: tuple[int, int, int]) -> list[list]:
    """Cut each group (label or relation) in the train:dev:test proportion, then shuffle each split."""
    total = sum(sizes)
    splits: list[list] = [[], [], []]
    for label, items in sorted(groups.items()):
        items = list(items)
        rng.shuffle(items)
        n_dev = round(len(items) * sizes[1] / total)
        n_test = round(len(items) * sizes[2] / total)
        n_train = len(items) - n_dev - n_test
        for split, chunk in zip(splits, (items[:n_train], items[n_train:n_train + n_dev], items[n_train + n_dev:])):
            split.extend((label, item) for item in chunk)
    for split, size in zip(splits, sizes):
        rng.shuffle(split)
        del split[size:]
    return splits


def write_tsv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    text = io.StringIO()
    writer = csv.writer(text, delimiter="\t", lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    atomic_write_text(path, text.getvalue())


def write_sentence_task(out_dir: Path, prefix: str, splits: list[list]) -> None:
    for split_name, split in zip(SPLIT_NAMES, splits):
        name = f"{prefix}-{split_name}.csv"
        if split_name == "test-student":
            # The course's sentiment test files carry two index columns under the header "0, '', id, sentence".
            rows = [[str(i + 1), f"{i}.0", example_id(name, i), text] for i, (_, text) in enumerate(split)]
            write_tsv(out_dir / name, ["0", "", "id", "sentence"], rows)
        else:
            rows = [[str(i), example_id(name, i), text, str(label)] for i, (label, text) in enumerate(split)]
            write_tsv(out_dir / name, ["", "id", "sentence", "sentiment"], rows)


def write_pair_task(out_dir: Path, prefix: str, label_column: str, splits: list[list]) -> None:
    for split_name, split in zip(SPLIT_NAMES, splits):
        name = f"{prefix}-{split_name}.csv"
        if split_name == "test-student":
            rows = [[str(i), example_id(name, i), first, second] for i, (first, second, _) in enumerate(split)]
            write_tsv(out_dir / name, ["", "id", "sentence1", "sentence2"], rows)
        else:
            rows = [[str(i), example_id(name, i), first, second, f"{label:.1f}"]
                    for i, (first, second, label) in enumerate(split)]
            write_tsv(out_dir / name, ["", "id", "sentence1", "sentence2", label_column], rows)


def write_demo_data(out_dir: Path, seed: int) -> None:
    """Every demo file in `out_dir` (made when missing): the four course tasks' CSVs from one generator of `seed`,
    then SQuAD's JSON files from their own."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)

    sst_total = sum(SST_SIZES)
    write_sentence_task(out_dir, "ids-sst", split_stratified(rng, sst_sentences(rng, sst_total // 5), SST_SIZES))
    cfimdb_total = sum(CFIMDB_SIZES)
    write_sentence_task(out_dir, "ids-cfimdb",
                        split_stratified(rng, cfimdb_reviews(rng, cfimdb_total // 2), CFIMDB_SIZES))

    quora_total = sum(QUORA_SIZES)
    n_duplicates = round(0.4 * quora_total)
    quora = quora_pairs(rng, n_duplicates, quora_total - n_duplicates)
    splits = split_stratified(rng, quora, QUORA_SIZES)
    write_pair_task(out_dir, "quora", "is_duplicate",
                    [[(a, b, float(label)) for label, (a, b) in split] for split in splits])

    splits = split_stratified(rng, sts_pairs(rng, sum(STS_SIZES)), STS_SIZES)
    write_pair_task(out_dir, "sts", "similarity", [[item for _, item in split] for split in splits])
    write_squad(out_dir, seed)
