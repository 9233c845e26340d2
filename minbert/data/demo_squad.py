"""SQuAD 2.0's demo files (train-v2.0.json, dev-v2.0.json, test-v2.0.json, the official layout): articles about
invented towns, whose answers are the fact sentences' spans; a question is unanswerable when its paragraph lacks that
fact or names another town.

    write_squad(Path("data/demo"), seed=0)
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from minbert.files import atomic_write_text

SQUAD_ARTICLES = (12, 4, 4)  # towns per split (train, dev, test); each gives SQUAD_QUESTIONS questions
SQUAD_QUESTIONS = (5, 5)  # answerable, unanswerable questions per town

# ---- SQuAD 2.0: articles about invented towns -----------------------------------------------------
# An article has three paragraphs: an overview (short), a history (long: 6-8 filler sentences with the
# founding and bridge facts among them, so that short windows need several per context) and town life.
# Each fact sentence holds known answer spans; a question about a fact its paragraph lacks (or about a
# town it does not mention) is unanswerable, with a plausible answer of the same kind, as in the official
# files.

TOWN_STARTS = ["Bel", "Cor", "Dun", "Fal", "Gar", "Hol", "Kes", "Lin", "Mar", "Nor", "Ost", "Pel", "Quen",
               "Ros", "Sal", "Tor", "Vel", "Wend", "Ard", "Brim"]
TOWN_ENDS = ["brook", "ford", "haven", "mere", "stead", "wick", "by", "dale", "holm", "port", "field", "moor"]
FIRST_NAMES = ["Marta", "Tomas", "Ilse", "Bruno", "Greta", "Anselm", "Lena", "Oskar", "Petra", "Viktor", "Nora",
               "Emil", "Helga", "Jonas", "Sofia", "Karel", "Mira", "Anton", "Edda", "Felix"]
SURNAMES = ["Kovel", "Brandt", "Aldana", "Horvath", "Lindqvist", "Moreau", "Petrescu", "Varga", "Okafor",
            "Tanaka", "Delacroix", "Novak", "Ferreira", "Halloran", "Szabo", "Ivers", "Marchetti", "Reyes"]
ROLES = ["merchant", "fisherman", "priest", "miller", "weaver", "soldier", "stonemason", "farmer"]
RIVERS = ["Aller", "Brenna", "Corvo", "Dessa", "Elvin", "Fenna", "Garra", "Lusk", "Mirel", "Ossa", "Tarn",
          "Vesta"]
REGIONS = ["northern", "southern", "eastern", "western", "central"]
SIZES_OF_TOWN = ["small", "quiet", "busy", "historic", "pretty"]
INDUSTRIES = ["glass making", "shipbuilding", "cheese making", "wool weaving", "clock making", "salt mining",
              "paper milling", "brewing", "pottery", "furniture making"]
DISHES = ["smoked trout with rye bread", "barley soup", "plum dumplings", "onion pie", "river crab stew",
          "honey cake", "cabbage rolls", "baked carp"]
FESTIVALS = ["Lantern Festival", "Harvest Fair", "Boat Festival", "Apple Festival", "Bell Festival",
             "Winter Market", "Kite Festival"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
HISTORY_FILLERS = [
    "In its first decades the settlement was little more than a row of wooden houses along the river.",
    "Farmers from the {region} hills brought wool, cheese and timber to its weekly market.",
    "A great fire in the old quarter destroyed many of the wooden houses, and the streets were rebuilt in stone.",
    "For a long time the town paid a yearly toll to the lords of the {region} valley.",
    "Floods reached the market square more than once, so the oldest houses stand on raised foundations.",
    "The town walls were later taken down, and their stones were used for new houses and a covered market.",
    "Travellers on the old salt road often stopped in {town} for the night, which made its inns famous.",
    "During one long winter the river froze so hard that carts could cross it for weeks.",
    "The town archive still keeps the letters, maps and tax rolls of those years.",
    "A plague in the following century left half of the houses empty for a generation.",
]
LIFE_FILLERS = [
    "The old market hall is now a library and a cafe.",
    "Two schools and a small hospital serve the town and the villages around it.",
    "A narrow railway connects {town} with the {region} coast.",
    "Most of the houses in the centre are painted in bright colours.",
]
# fact -> (kind, question templates); the kind picks an unanswerable question's plausible answer.
FACT_QUESTIONS = {
    "river": ("thing", ["On which river does {town} stand?", "What river flows through {town}?"]),
    "distance": ("number", ["How far is {town} from the sea?"]),
    "population": ("number", ["How many people live in {town}?", "What is the population of {town}?"]),
    "founder": ("person", ["Who founded {town}?", "Who was the founder of {town}?"]),
    "founded": ("year", ["In what year was {town} founded?", "When was {town} founded?"]),
    "builder": ("person", ["Who built the first stone bridge in {town}?",
                           "Which engineer built the first stone bridge in {town}?"]),
    "bridge_year": ("year", ["When was the first stone bridge in {town} built?"]),
    "mayor": ("person", ["Who is the mayor of {town}?", "Who has been the mayor of {town} in recent years?"]),
    "industry": ("thing", ["What is the main industry of {town}?", "Which industry employs the most people in {town}?"]),
    "festival": ("month", ["In which month does {town} hold its {festival}?"]),
    "dish": ("thing", ["What is the local dish of {town}?", "Which dish is {town} known for?"]),
}


@dataclass
class Sentence:
    text: str
    answers: dict[str, list[str]]  # fact -> answer variants, the canonical one first; each a substring of text


def town_facts(rng: random.Random, town: str) -> dict:
    person = lambda: f"{rng.choice(FIRST_NAMES)} {rng.choice(SURNAMES)}"  # noqa: E731
    return {"town": town, "region": rng.choice(REGIONS), "size": rng.choice(SIZES_OF_TOWN),
            "river": rng.choice(RIVERS), "distance": rng.randint(5, 120), "population": f"{rng.randint(20, 900) * 100:,}",
            "founder": person(), "role": rng.choice(ROLES), "founded": rng.randint(1100, 1690),
            "builder": person(), "bridge_year": rng.randint(1700, 1899), "mayor": person(),
            "mayor_year": rng.randint(1995, 2021), "industry": rng.choice(INDUSTRIES), "workers": rng.randint(3, 40) * 50,
            "festival": rng.choice(FESTIVALS), "month": rng.choice(MONTHS), "dish": rng.choice(DISHES)}


def town_paragraphs(rng: random.Random, f: dict) -> list[list[Sentence]]:
    """The overview, history and town-life paragraphs of one town, as sentences with their answers."""
    t = f["town"]
    overview = [Sentence(f"{t} is a {f['size']} town in the {f['region']} hills.", {}),
                Sentence(f"It stands on the {f['river']} River.", {"river": [f["river"], f"{f['river']} River"]})]
    if rng.random() < 0.6:
        overview.append(Sentence(f"The sea is {f['distance']} kilometres away.",
                                 {"distance": [f"{f['distance']} kilometres", str(f["distance"])]}))
    if rng.random() < 0.6:
        overview.append(Sentence(f"It has about {f['population']} inhabitants.",
                                 {"population": [f["population"], f"about {f['population']}",
                                                 f"about {f['population']} inhabitants"]}))
    if rng.random() < 0.5:
        founding = f"{t} was founded by the {f['role']} {f['founder']} in {f['founded']}."
        founders = [f["founder"], f"the {f['role']} {f['founder']}", f"{f['role']} {f['founder']}"]
    else:
        founding = f"The {f['role']} {f['founder']} founded {t} in {f['founded']}."
        founders = [f["founder"], f"The {f['role']} {f['founder']}", f"{f['role']} {f['founder']}"]
    founding = Sentence(founding, {"founder": founders, "founded": [str(f["founded"]), f"in {f['founded']}"]})
    bridge = Sentence(f"The first stone bridge in {t} was built by the engineer {f['builder']} in {f['bridge_year']}.",
                      {"builder": [f["builder"], f"the engineer {f['builder']}", f"engineer {f['builder']}"],
                       "bridge_year": [str(f["bridge_year"]), f"in {f['bridge_year']}"]})
    facts = [s for s in (founding, bridge) if rng.random() < 0.8] or [rng.choice([founding, bridge])]
    history = [Sentence(text.format(**f), {}) for text in rng.sample(HISTORY_FILLERS, rng.randint(6, 8))]
    for sentence in facts:  # anywhere after the first filler: often in a later window of a short window size
        history.insert(rng.randint(1, len(history)), sentence)
    life_facts = [Sentence(f"Since {f['mayor_year']}, the mayor of {t} has been {f['mayor']}.", {"mayor": [f["mayor"]]}),
                  Sentence(f"The main industry of {t} is {f['industry']}, which employs about {f['workers']} workers.",
                           {"industry": [f["industry"]]}),
                  Sentence(f"Every {f['month']}, {t} holds its {f['festival']}, which draws visitors from the whole "
                           "region.", {"festival": [f["month"], f"Every {f['month']}"]}),
                  Sentence(f"The local dish of {t} is {f['dish']}.", {"dish": [f["dish"]]})]
    life = [s for s in life_facts if rng.random() < 0.6]
    while len(life) < 2:
        life = [s for s in life_facts if s in life or rng.random() < 0.5]
    life += [Sentence(text.format(**f), {}) for text in rng.sample(LIFE_FILLERS, rng.randint(1, 2))]
    life = [life[0], *rng.sample(life[1:], len(life) - 1)]
    return [overview, history, life]


def locate(sentences: list[Sentence]) -> tuple[str, dict[str, list[tuple[str, int]]]]:
    """The paragraph's text and each fact's answer variants with their character offsets in it."""
    context, answers = "", {}
    for sentence in sentences:
        if context:
            context += " "
        for fact, variants in sentence.answers.items():
            answers[fact] = [(text, len(context) + sentence.text.index(text)) for text in variants]
        context += sentence.text
    for variants in answers.values():
        assert all(context[start:start + len(text)] == text for text, start in variants)
    return context, answers


def squad_questions(rng: random.Random, facts: dict, context: str, answers: dict, other_towns: list[str]) -> tuple[list, list]:
    """A paragraph's candidate (answerable, unanswerable) questions as (question, answers, plausible_answers)."""
    def ask(fact: str, town: str) -> str:
        return rng.choice(FACT_QUESTIONS[fact][1]).format(**{**facts, "town": town})

    def gold(variants: list[tuple[str, int]]) -> list[dict]:
        # The canonical span first (the one windows are labelled with), then up to two more annotators'
        # spans, as in the official dev file: often the same span again, sometimes another one.
        chosen = [variants[0]] + [rng.choice(variants) for _ in range(rng.choice([0, 0, 1, 2]))]
        return [{"text": text, "answer_start": start} for text, start in chosen]

    answerable = [(ask(fact, facts["town"]), gold(variants), None) for fact, variants in answers.items()]
    unanswerable = []
    for fact, (kind, _) in FACT_QUESTIONS.items():
        if fact in answers:  # the same fact of a town this paragraph does not mention
            town = rng.choice(other_towns)
            unanswerable.append((ask(fact, town), [], [gold(answers[fact])[0]]))
        else:  # a fact the paragraph lacks: the plausible answer is a span of the same kind, or any answer
            alike = [f for f in answers if FACT_QUESTIONS[f][0] == kind] or list(answers)
            if alike:
                unanswerable.append((ask(fact, facts["town"]), [], [gold(answers[rng.choice(alike)])[0]]))
    assert all(q for q, _, _ in answerable + unanswerable) and context
    return answerable, unanswerable


def squad_articles(rng: random.Random, towns: list[str], other_towns: list[str]) -> list[dict]:
    """Articles in the official layout, SQUAD_QUESTIONS[0] answerable and [1] unanswerable questions each."""
    articles = []
    for town in towns:
        facts = town_facts(rng, town)
        paragraphs = []
        candidates: tuple[list, list] = ([], [])
        for number, sentences in enumerate(town_paragraphs(rng, facts)):
            context, answers = locate(sentences)
            paragraphs.append({"context": context, "qas": []})
            for pool, found in zip(candidates, squad_questions(rng, facts, context, answers, other_towns)):
                pool.extend((number, *question) for question in found)
        chosen = [item for pool, n in zip(candidates, SQUAD_QUESTIONS) for item in rng.sample(pool, n)]
        for number, question, gold, plausible in sorted(chosen, key=lambda item: item[0]):
            qa = {"question": question, "id": None, "answers": gold, "is_impossible": not gold}
            if plausible:
                qa["plausible_answers"] = plausible
            paragraphs[number]["qas"].append(qa)
        articles.append({"title": town, "paragraphs": [p for p in paragraphs if p["qas"]]})
    return articles


def squad_id(split: str, index: int) -> str:
    return hashlib.md5(f"minbert-demo/squad/{split}/{index}".encode()).hexdigest()[:24]  # 24 hex digits, as official


def write_squad(out_dir: Path, seed: int) -> None:
    """train-v2.0.json, dev-v2.0.json and test-v2.0.json (questions only: id and question) of distinct towns."""
    rng = random.Random(f"minbert-demo/squad/{seed}")  # its own generator: the CSVs do not depend on it
    names = rng.sample([start + end for start in TOWN_STARTS for end in TOWN_ENDS], sum(SQUAD_ARTICLES) + 10)
    towns, other_towns = names[:sum(SQUAD_ARTICLES)], names[sum(SQUAD_ARTICLES):]  # the others are never described
    first = 0
    for split, n_articles in zip(("train", "dev", "test"), SQUAD_ARTICLES):
        articles = squad_articles(rng, towns[first:first + n_articles], other_towns)
        first += n_articles
        index = 0
        for article in articles:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    qa["id"] = squad_id(split, index)
                    index += 1
                if split == "test":  # the official test file's layout: no answers
                    paragraph["qas"] = [{"question": qa["question"], "id": qa["id"]} for qa in paragraph["qas"]]
        text = json.dumps({"version": "v2.0", "data": articles}, ensure_ascii=False, indent=1)
        atomic_write_text(out_dir / f"{split}-v2.0.json", text + "\n")
