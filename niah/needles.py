"""Needles: a fresh fact per trial from a seeded RNG, and the question that asks for it.

    The special magic number for Lisbon is 4829163.

The key is a city (the bundled corpus names none); the value is 7 digits (the corpus
holds no digits). `trial_seed()` makes each trial's seed a function of the base seed
and the trial's coordinates only, so every configuration sees identical prompts.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

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
