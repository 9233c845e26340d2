"""Seeded noise on text: character edits inside words and edits of whole words, each at a rate, reproducible from a
seed and the example's id alone (the same example gets the same noise whichever other examples are perturbed).

    noise = Noise("char_swap", 0.1)               # one adjacent swap in 10% of the words it applies to
    text, changed, eligible = noise.apply("It 's a lovely film .", random.Random("0/char_swap-0.1/id/sentence"))
    perturbed, changed, eligible = perturb_examples(examples, ("sentence",), noise, seed=0)

A word, for the character edits, is a run of ASCII letters; each chosen word gets exactly one edit:
    char_swap      two adjacent letters that differ trade places (words with such a pair)
    char_insert    a random letter is inserted at a random place in the word (every word)
    char_delete    one letter is removed (words of two letters or more)
    char_keyboard  one letter becomes a neighbouring key on a QWERTY keyboard, its case kept (every word)
A word, for the word edits, is a whitespace-separated token holding a letter or digit (punctuation tokens stay):
    word_delete    the word and the whitespace after it go (never every word of a text)
    word_swap      two adjacent words that differ trade places; the rate is the share of words moved, two a swap
    word_neighbour a word whose letters are one whole word of the vocabulary becomes one of its nearest words in the
                   model's input-embedding space (neighbours.EmbeddingNeighbours), chosen at random, its case and
                   surrounding punctuation kept
The rate is the share of the text's words that the edit applies to which it changes: rate x eligible words, rounded
down or up at random in proportion (stochastic rounding), so that over many texts the share changed is the rate, a
short text included. Nothing else of the text changes, its whitespace included.
"""
from __future__ import annotations

import dataclasses
import math
import random
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass

CHAR_KINDS = ("char_swap", "char_insert", "char_delete", "char_keyboard")
WORD_KINDS = ("word_delete", "word_swap", "word_neighbour")
KINDS = CHAR_KINDS + WORD_KINDS
Neighbours = Callable[[str], Sequence[str]]  # a lowercase word -> its nearest words, nearest first

LETTERS = re.compile(r"[A-Za-z]+")
WORD = re.compile(r"[^\W_]")  # a token holding a letter or digit is a word
CORE = re.compile(r"^([^A-Za-z]*)([A-Za-z]+)([^A-Za-z]*)$")  # punctuation around one run of letters
KEYBOARD_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")


def _keyboard() -> dict[str, str]:
    """Each letter's neighbouring keys: its row's, and on a staggered keyboard the two above it (same column and the
    next) and the two below (the previous column and the same)."""
    position = {key: (row, column) for row, keys in enumerate(KEYBOARD_ROWS) for column, key in enumerate(keys)}
    at = {place: key for key, place in position.items()}
    neighbours = {}
    for key, (row, column) in position.items():
        around = [(row, column - 1), (row, column + 1), (row - 1, column), (row - 1, column + 1), (row + 1, column - 1),
                  (row + 1, column)]
        neighbours[key] = "".join(at[place] for place in around if place in at)
    return neighbours


KEYBOARD = _keyboard()


def stochastic_count(rate: float, eligible: int, rng: random.Random) -> int:
    """rate x eligible rounded down, or up with the probability of its fraction: unbiased on short texts."""
    exact = rate * eligible
    whole = math.floor(exact)
    return whole + (rng.random() < exact - whole)


def _cased(letter: str, like: str) -> str:
    return letter.upper() if like.isupper() else letter


def _swap(word: str, rng: random.Random) -> str:
    places = [i for i in range(len(word) - 1) if word[i].lower() != word[i + 1].lower()]
    i = rng.choice(places)
    return word[:i] + word[i + 1] + word[i] + word[i + 2:]


def _insert(word: str, rng: random.Random) -> str:
    i = rng.randrange(len(word) + 1)
    return word[:i] + _cased(rng.choice(string.ascii_lowercase), word) + word[i:]


def _delete(word: str, rng: random.Random) -> str:
    i = rng.randrange(len(word))
    return word[:i] + word[i + 1:]


def _keyboard_typo(word: str, rng: random.Random) -> str:
    i = rng.randrange(len(word))
    return word[:i] + _cased(rng.choice(KEYBOARD[word[i].lower()]), word[i]) + word[i + 1:]


# kind -> (whether a word can take the edit, the edit)
CHAR_EDITS: dict[str, tuple[Callable[[str], bool], Callable[[str, random.Random], str]]] = {
    "char_swap": (lambda word: any(a.lower() != b.lower() for a, b in zip(word, word[1:])), _swap),
    "char_insert": (lambda word: True, _insert),
    "char_delete": (lambda word: len(word) >= 2, _delete),
    "char_keyboard": (lambda word: True, _keyboard_typo),
}


@dataclass(frozen=True)
class Words:
    """A text cut into tokens and the whitespace between them (tokens at the even places of `parts`), which
    `text` puts back exactly."""
    parts: tuple[str, ...]

    @classmethod
    def of(cls, text: str) -> "Words":
        return cls(tuple(re.split(r"(\s+)", text)))

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def words(self) -> list[int]:
        """The places in `parts` of the tokens that are words (hold a letter or digit)."""
        return [place for place in range(0, len(self.parts), 2) if WORD.search(self.parts[place])]

    def replaced(self, changes: dict[int, str]) -> "Words":
        return Words(tuple(changes.get(place, part) for place, part in enumerate(self.parts)))

    def without(self, places: set[int]) -> "Words":
        """The text without the tokens at `places` and the whitespace after each (before it, for the last)."""
        kept = [(self.parts[place], self.parts[place + 1] if place + 1 < len(self.parts) else "")
                for place in range(0, len(self.parts), 2) if place not in places]
        parts = [piece for token, space in kept for piece in (token, space)]
        return Words(tuple(parts[:-1]) if parts else ("",))


def neighbour_forms(token: str, neighbours: Neighbours) -> list[str]:
    """The token with its letters replaced by each of their nearest words, case and punctuation kept; [] for a token
    that is not one run of letters or whose lowercase letters have no neighbours (no whole word of the vocabulary)."""
    match = CORE.match(token)
    if match is None:
        return []
    before, core, after = match.groups()
    cased = str.upper if core.isupper() and len(core) > 1 else str.capitalize if core[0].isupper() else str.lower
    return [before + cased(word) + after for word in neighbours(core.lower())]


@dataclass(frozen=True)
class Noise:
    """One kind of noise (KINDS) at one rate in (0, 1]."""
    kind: str
    rate: float

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"noise kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not (isinstance(self.rate, (int, float)) and 0 < self.rate <= 1):
            raise ValueError(f"a noise rate must be in (0, 1], got {self.rate!r}")

    @property
    def name(self) -> str:
        """Its variant's name, also its folder among the perturbed sets: char_swap-0.1."""
        return f"{self.kind}-{self.rate:g}"

    @property
    def family(self) -> str:
        return "char" if self.kind in CHAR_KINDS else "word"

    def apply(self, text: str, rng: random.Random, neighbours: Neighbours | None = None) -> tuple[str, int, int]:
        """(the noisy text, the words changed, the words the edit applies to); word_neighbour needs `neighbours`."""
        if self.family == "char":
            return self._char_noise(text, rng)
        return self._word_noise(Words.of(text), rng, neighbours)

    def _char_noise(self, text: str, rng: random.Random) -> tuple[str, int, int]:
        applies, edit = CHAR_EDITS[self.kind]
        eligible = [match.span() for match in LETTERS.finditer(text) if applies(match.group())]
        chosen = sorted(rng.sample(eligible, stochastic_count(self.rate, len(eligible), rng)))
        pieces, end = [], 0
        for start, stop in chosen:
            pieces += [text[end:start], edit(text[start:stop], rng)]
            end = stop
        return "".join(pieces) + text[end:], len(chosen), len(eligible)

    def _word_noise(self, words: Words, rng: random.Random, neighbours: Neighbours | None) -> tuple[str, int, int]:
        places = words.words()
        if self.kind == "word_delete":
            count = min(stochastic_count(self.rate, len(places), rng), max(len(places) - 1, 0))
            return words.without(set(rng.sample(places, count))).text, count, len(places)
        if self.kind == "word_swap":
            return _swap_words(words, places, self.rate, rng)
        if neighbours is None:
            raise ValueError("word_neighbour noise needs the model's neighbours (neighbours.EmbeddingNeighbours)")
        forms = {place: neighbour_forms(words.parts[place], neighbours) for place in places}
        eligible = [place for place in places if forms[place]]
        chosen = rng.sample(eligible, stochastic_count(self.rate, len(eligible), rng))
        return words.replaced({place: rng.choice(forms[place]) for place in sorted(chosen)}).text, len(chosen), len(
            eligible)


def _swap_words(words: Words, places: list[int], rate: float, rng: random.Random) -> tuple[str, int, int]:
    """Non-overlapping swaps of adjacent differing words, rate x words / 2 of them where the text has enough."""
    wanted = stochastic_count(rate / 2, len(places), rng)
    pairs = [i for i in range(len(places) - 1) if words.parts[places[i]].lower() != words.parts[places[i + 1]].lower()]
    rng.shuffle(pairs)
    taken: list[int] = []
    for i in pairs:
        if len(taken) == wanted:
            break
        if all(abs(i - j) > 1 for j in taken):
            taken.append(i)
    changes = {}
    for i in taken:
        first, second = places[i], places[i + 1]
        changes[first], changes[second] = words.parts[second], words.parts[first]
    return words.replaced(changes).text, 2 * len(taken), len(places)


def example_rng(seed: int, noise: Noise, example_id: str, column: str) -> random.Random:
    """The generator of one text's noise: from the seed, the variant, the example's id and its column alone (a
    string seed is hashed by SHA-512: the same in every process and Python version 3)."""
    return random.Random(f"{seed}/{noise.name}/{example_id}/{column}")


def perturb_examples(examples: Sequence, text_columns: Sequence[str], noise: Noise, seed: int,
                     neighbours: Neighbours | None = None) -> tuple[list, int, int]:
    """Every example with `noise` in each of its text columns (a pair's two sentences, each on its own), and the
    words changed and eligible over all of them."""
    perturbed, changed, eligible = [], 0, 0
    for example in examples:
        texts = {}
        for column in text_columns:
            rng = example_rng(seed, noise, example.id, column)
            texts[column], done, could = noise.apply(getattr(example, column), rng, neighbours)
            changed, eligible = changed + done, eligible + could
        perturbed.append(dataclasses.replace(example, **texts))
    return perturbed, changed, eligible
