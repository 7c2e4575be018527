"""Needles: fresh facts per trial from a seeded RNG, and the question that asks for them.

    The special magic number for Lisbon is 4829163.

By default the key is a city (the bundled corpus names none) and the value 7 digits (the
corpus holds no digits). `NeedleKind` gives the kinds peers offer (RULER): keys as cities
or words, values as numbers, uuids or words, several values per key (`values`), several
keys in the haystack (`keys`, the others are distractors) and several keys asked at once
(`queries`). `trial_seed()` makes each trial's seed a function of the base seed and the
trial's coordinates only, so every configuration sees identical prompts.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from dataclasses import asdict, dataclass

from niah.errors import BadInput

CITIES = (
    "Lisbon Porto Madrid Seville Valencia Barcelona Marseille Lyon Toulouse Bordeaux Nantes "
    "Strasbourg Brussels Antwerp Ghent Rotterdam Amsterdam Utrecht Hamburg Bremen Hanover "
    "Leipzig Dresden Munich Stuttgart Cologne Frankfurt Vienna Salzburg Graz Zurich Geneva "
    "Basel Lausanne Milan Turin Genoa Bologna Florence Naples Palermo Venice Verona Trieste "
    "Ljubljana Zagreb Split Sarajevo Belgrade Sofia Bucharest Budapest Bratislava Prague Brno "
    "Krakow Warsaw Gdansk Wroclaw Vilnius Riga Tallinn Helsinki Stockholm Gothenburg Malmo "
    "Oslo Bergen Copenhagen Aarhus Reykjavik Dublin Cork Belfast Edinburgh Glasgow Aberdeen "
    "Cardiff Liverpool Manchester Leeds Sheffield Bristol Athens Thessaloniki Istanbul Ankara "
    "Izmir Tbilisi Yerevan Baku Tehran Baghdad Beirut Amman Damascus Cairo Alexandria Tunis "
    "Algiers Casablanca Marrakesh Dakar Accra Lagos Abuja Nairobi Mombasa Kampala Kigali "
    "Lusaka Harare Maputo Johannesburg Durban Windhoek Luanda Kinshasa Khartoum Karachi "
    "Lahore Delhi Mumbai Chennai Kolkata Bangalore Hyderabad Kathmandu Dhaka Colombo Yangon "
    "Bangkok Hanoi Saigon Vientiane Manila Jakarta Surabaya Kuala Lumpur Singapore Taipei "
    "Shanghai Beijing Chengdu Wuhan Xian Seoul Busan Osaka Kyoto Sapporo Nagoya Tokyo "
    "Ulaanbaatar Almaty Tashkent Samarkand Perth Adelaide Melbourne Sydney Brisbane Auckland "
    "Wellington Honolulu Anchorage Vancouver Calgary Winnipeg Toronto Montreal Quebec Halifax "
    "Boston Chicago Detroit Denver Seattle Portland Houston Dallas Atlanta Miami Havana "
    "Kingston Bogota Quito Lima Cusco Santiago Valparaiso Montevideo Asuncion Caracas Recife "
    "Salvador Fortaleza Manaus Cordoba Rosario Mendoza"
).replace("Kuala Lumpur", "Kuala_Lumpur").split()
CITIES = tuple(c.replace("_", " ") for c in CITIES)

NEEDLE = "The special magic number for {key} is {value}."
QUESTION = "What is the special magic number for {key} mentioned in the text above? Answer with the number only."
ANSWER_PREFIX = "The special magic number for {key} is"


@dataclass(frozen=True)
class Needle:
    key: str
    value: str

    @property
    def sentence(self) -> str:
        return NEEDLE.format(key=self.key, value=self.value)

    @property
    def question(self) -> str:
        return QUESTION.format(key=self.key)

    @property
    def answer_prefix(self) -> str:
        return ANSWER_PREFIX.format(key=self.key)


def trial_seed(base_seed: int, length: int, depth: float, trial: int) -> int:
    """Seed of one trial: depends only on (base seed, length, depth, trial)."""
    tag = f"niah|{int(base_seed)}|{int(length)}|{float(depth):g}|{int(trial)}".encode()
    return int.from_bytes(hashlib.sha256(tag).digest()[:8], "big") >> 1


def make_needle(rng: random.Random) -> Needle:
    return Needle(key=rng.choice(CITIES), value=str(rng.randint(1_000_000, 9_999_999)))


# -- needle kinds ---------------------------------------------------------------------------
# Word keys and values: plain, uncommon English words (a word that occurs in the haystack
# is drawn again, so a value never appears outside its fact).
WORDS = tuple("""
abacus acorn admiral albatross alcove almanac amber anchor anvil apricot archer armada
aspen atlas avalanche badger bagpipe balcony bamboo banjo barnacle basalt bayonet beacon
bellows bison blizzard bobcat bonfire boulder bramble brigade buckle bugle cactus caldera
camel canoe canyon caravan cardinal carousel cathedral cavalry cedar chalice chameleon
chariot cheetah chimney cinnamon citadel clover cobalt comet compass condor coral cormorant
coyote crater crescent cricket crocus crystal cymbal dagger daisy dolphin dragonfly dromedary
dune eclipse eggplant elk ember emerald falcon fennel ferret fiddle flamingo flint fossil
galleon gazelle geyser ginger glacier gondola gorilla granite griffin hammock harpoon hazelnut
hedgehog helmet heron hibiscus hornet hyacinth iceberg iguana indigo ivory jackal jaguar
jasmine juniper kayak kestrel kettle kiwi koala lagoon lantern lavender lemur leopard lichen
lighthouse lobster locket lotus lynx magnolia mammoth mandolin mango marble marigold marmot
meadowlark meteor mimosa minnow moose mosaic musket narwhal nebula nectar nutmeg oasis obelisk
octopus orchid osprey otter paddle pagoda panther papyrus parrot peacock pelican pendulum
penguin pepper pheasant piano pinecone pistachio plankton platypus plum porcupine prism
puffin pumpkin python quail quartz quiver raccoon raven reindeer rhubarb rhino saffron
salamander sapphire scarab scorpion seahorse sequoia sextant shamrock sparrow sphinx squid
starfish stingray sundial swordfish tambourine tapir telescope thimble thistle tiger toucan
trombone trumpet tulip turquoise tortoise trident tundra turnip typhoon ukulele unicorn urchin
vanilla velvet violin volcano vulture walnut walrus whistle wigwam wolverine wombat yak zebra
zeppelin zinnia
""".split())
KEY_KINDS = ("city", "word")
VALUE_KINDS = ("number", "uuid", "word")
_NOUN = {"number": ("number", "numbers"), "uuid": ("uuid", "uuids"), "word": ("word", "words")}


@dataclass(frozen=True)
class NeedleKind:
    """What facts a trial hides and what it asks. The default is today's single needle."""

    key: str = "city"  # city | word
    value: str = "number"  # number (7 digits) | uuid | word
    values: int = 1  # values per key; all of an asked key's values must come back
    keys: int = 1  # keys in the haystack (the ones not asked are distractors)
    queries: int = 1  # keys asked at once

    def check(self) -> None:
        if self.key not in KEY_KINDS:
            raise BadInput(f"--needle-key must be one of {', '.join(KEY_KINDS)}, not {self.key!r}")
        if self.value not in VALUE_KINDS:
            raise BadInput(f"--needle-value must be one of {', '.join(VALUE_KINDS)}, not {self.value!r}")
        for name in ("values", "keys", "queries"):
            if getattr(self, name) < 1:
                raise BadInput(f"--{name} must be at least 1 (got {getattr(self, name)})")
        if self.queries > self.keys:
            raise BadInput(f"--queries {self.queries} asks more keys than --keys {self.keys} hides")

    @property
    def default(self) -> bool:
        return self == NeedleKind(keys=self.keys)

    def as_dict(self) -> dict:
        return asdict(self)

    def draw_key(self, rng: random.Random) -> str:
        return rng.choice(CITIES) if self.key == "city" else rng.choice(WORDS)

    def draw_value(self, rng: random.Random) -> str:
        if self.value == "number":
            return str(rng.randint(1_000_000, 9_999_999))
        if self.value == "uuid":
            return str(uuid.UUID(int=rng.getrandbits(128), version=4))
        return rng.choice(WORDS)

    def sentence(self, key: str, value: str) -> str:
        if self.value == "number":
            return NEEDLE.format(key=key, value=value)
        return f"The special magic {self.value} for {key} is {value}."

    def question(self, keys: list[str]) -> str:
        if self.values == 1 and len(keys) == 1:
            if self.value == "number":
                return QUESTION.format(key=keys[0])
            return (f"What is the special magic {self.value} for {keys[0]} mentioned in the text above? "
                    f"Answer with the {self.value} only.")
        one, many = _NOUN[self.value]
        names = keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + " and " + keys[-1]
        return (f"What are all the special magic {many} for {names} mentioned in the text above? "
                f"Answer with every {one}, nothing else.")

    def answer_prefix(self, keys: list[str]) -> str:
        if self.values == 1 and len(keys) == 1:
            if self.value == "number":
                return ANSWER_PREFIX.format(key=keys[0])
            return f"The special magic {self.value} for {keys[0]} is"
        return f"The special magic {_NOUN[self.value][1]} for {', '.join(keys)} are"
