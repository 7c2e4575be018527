"""Regenerate niah/corpus/haystack.txt: the filler prose every haystack is cut from.

Written for this project (see SOURCE.md). The text is composed from hand-written
sentence templates about everyday crafts, places and seasons, with slots filled from
hand-written word lists by a seeded RNG, so it reads like plain descriptive prose,
never repeats a sentence in practice, and holds no digits and no city names (the
needles use both). Run it only to change the corpus; every prompt depends on the file:

    python niah/corpus/generate.py > niah/corpus/haystack.txt
"""

from __future__ import annotations

import random
import re
import sys

W = {
    "person": "the keeper|the old miller|my neighbour|the ferryman|a shepherd|the baker|the schoolteacher|"
    "the carpenter|my grandmother|the potter|the beekeeper|a travelling tinker|the gardener|the weaver|"
    "the harbour master|the blacksmith|a young apprentice|the innkeeper|the forester|the clockmaker|"
    "the fisherman's widow|the parish clerk|a quiet stranger|the cheesemaker|the cartographer|the glassblower",
    "place": "the valley|the lower meadow|the old harbour|the orchard|the marsh|the high pasture|the village green|"
    "the mill pond|the churchyard|the quarry|the birch wood|the river bend|the salt flats|the hill farm|"
    "the market square|the walled garden|the estuary|the moor|the long beach|the chalk downs|the hedgerow lane|"
    "the ferry landing|the beech hanger|the reed beds|the sheep fold|the stone bridge",
    "season": "spring|early summer|high summer|late summer|autumn|the first frosts|winter|the thaw|harvest time|"
    "the long evenings of June|the wet weeks of November|the grey end of February",
    "weather": "a thin rain|a steady westerly wind|low cloud|a hard frost|bright, cold sunshine|a warm haze|"
    "a sea fog|heavy, slow rain|a dry east wind|a sky full of torn cloud|a still, heavy heat|fine snow",
    "material": "oak|ash|elm|clay|wool|linen|copper|iron|willow|slate|flint|hazel|beeswax|tallow|horn|"
    "limestone|chestnut|yew|hemp|pewter|birch bark|rush",
    "thing": "a wooden bucket|a clay jug|a basket of apples|a coil of rope|a lantern|a pair of shears|"
    "a ledger|a heavy coat|a loaf of rye bread|a hand plough|a spinning wheel|a copper kettle|a net|"
    "a bundle of kindling|a sack of flour|a hayrake|a tin of nails|a whetstone|a pair of boots|"
    "a box of seeds|a honey comb|a folded map|a bell|a mallet|a sieve|a small boat",
    "animal": "a heron|the sheepdog|a pair of swans|a fox|the geese|a hare|a barn owl|the cows|a wren|"
    "a kingfisher|the bees|a badger|a flock of starlings|the old horse|a curlew|a pair of crows|"
    "the goats|a stoat|a robin|the hens",
    "plant": "nettles|wild garlic|bracken|hawthorn|elder|heather|meadowsweet|gorse|ivy|bramble|"
    "cow parsley|foxgloves|thistles|rushes|moss|clover|primroses|sorrel|dog roses|bluebells",
    "adj": "patient|careful|quiet|stubborn|generous|weathered|unhurried|practical|thoughtful|cheerful|"
    "restless|gentle|sharp-eyed|sparing|proud|kindly",
    "texture": "rough|smooth|damp|brittle|warm|cold|soft|grainy|sticky|dry|supple|heavy",
    "light": "the first light|the late afternoon light|a pale dawn|the blue dusk|the lamplight|"
    "the slanting evening sun|the glare of noon|the grey light of morning|the light of the fire",
    "sound": "the creak of the gate|the hum of the bees|the tick of the clock|the rush of the weir|"
    "the cry of gulls|the clatter of the loom|the ring of the anvil|the patter of rain|"
    "the lowing of cattle|the crackle of the fire|the slap of water against the hull|the wind in the chimney",
    "verb_work": "mended|scrubbed|sharpened|stacked|oiled|patched|sorted|swept|carried|tied|"
    "sanded|painted|counted|wrapped|checked|hung",
    "feeling": "contentment|a small, stubborn pride|unease|relief|a kind of tenderness|boredom|"
    "quiet satisfaction|impatience|gratitude|a faint sadness|curiosity|amusement",
    "time": "in the morning|before breakfast|by midday|in the evening|after supper|at first light|"
    "late at night|on market days|every other week|once a year|on wet afternoons|at the turn of the tide",
    "opener": "In those days|As a rule|More often than not|For the most part|Even so|Looking back|"
    "All the same|Now and then|Sooner or later|By and large|To be fair|Of course|Strangely enough|"
    "At any rate|Usually|Sometimes|Often|Later|After that|On the whole",
}

T = [
    "{person} {verb_work} {thing} {time}, and nobody thought to ask why.",
    "{opener}, {person} would walk down to {place} when {weather} came in.",
    "In {season} {place} smelled of {plant} and wet {material}.",
    "{person} kept {thing} by the door, though it was hardly ever used.",
    "There was always {sound} somewhere behind the talk.",
    "{opener}, the work was {texture} and slow, and it suited {person} well enough.",
    "{animal} came to {place} {time}, as if it had an appointment there.",
    "Under {light} the {material} looked almost golden.",
    "{person} said that {plant} grew best where nobody bothered to look after it.",
    "We learned to judge {weather} by the colour of the water at {place}.",
    "{opener}, {person} was {adj} about small things and careless about large ones.",
    "The {material} had gone {texture} after {season}, and it had to be {verb_work} again.",
    "{person} {verb_work} the shelves while listening to {sound}.",
    "It took the better part of {season} to learn how {thing} ought to be handled.",
    "{opener}, there was nothing to do but wait for {weather} to pass.",
    "{animal} watched from the edge of {place} and did not move.",
    "Nobody remembered who had first planted {plant} along the wall at {place}.",
    "{person} had a {adj} way of explaining things, one step at a time.",
    "The path to {place} was lined with {plant} and loose {material}.",
    "I remember {light}, {sound}, and the feeling of {feeling} that came with it.",
    "{opener}, {person} brought {thing} and set it down without a word.",
    "When {weather} settled over {place}, the whole valley seemed to hold its breath.",
    "{person} believed that {material} should never be left {texture} overnight.",
    "{person} spoke of {feeling} in finishing a job that nobody would notice.",
    "{opener}, the children were sent to {place} to look for {animal}.",
    "{person} {verb_work} {thing} twice, because the first time had not been good enough.",
    "In {season} the days were measured by {sound} rather than by the clock.",
    "The barn at {place} was built of {material} and roofed with {material}.",
    "{opener}, {person} grew {adj} with age, though never unkind.",
    "You could tell the time {time} by {sound} alone.",
    "{animal} had made a home among the {plant} behind the wall.",
    "{person} said the trick was to let the {material} rest before working it.",
    "{opener}, we ate by {light} and talked about {season}.",
    "{weather} meant that {place} would be flooded by morning.",
    "Everything at {place} was {texture} to the touch after {weather}.",
    "{person} never threw away {thing}, on the grounds that it might be useful one day.",
    "The smell of {plant} always brought back {season} at {place}.",
    "{opener}, {person} felt {feeling} and said nothing about it.",
    "A good {material} handle outlasts the blade, or so {person} used to say.",
    "{animal} crossed {place} slowly, stopping now and then to listen.",
    "{person} {verb_work} the fences at {place} before {season} set in.",
    "{opener}, the market was loud with {sound} and the smell of {plant}.",
    "It was {person} who taught us to read {weather} in the shape of the clouds.",
    "The old road to {place} had sunk between banks of {plant}.",
    "{opener}, a {adj} patience was worth more than any tool in the shed.",
    "{person} carried {thing} across {place} {time}, whatever the weather.",
    "By {light} {place} looked smaller and older than it really was.",
    "{animal} and {animal} shared {place} without much quarrelling.",
    "{opener}, {person} preferred {material} to anything bought in town.",
    "We heard {sound} long before we could see {place}.",
    "{person} kept a careful list of every {material} beam in the house.",
    "{season} brought {weather} and, with it, a great deal of mending.",
    "{opener}, there was {feeling} in the way {person} closed the gate.",
    "The floor was {texture} {material}, worn into hollows by generations of boots.",
    "{person} found {thing} half buried among the {plant} at {place}.",
    "{opener}, the best work was done {time}, before anyone else was about.",
    "No one at {place} could agree on the right way to store {thing}.",
    "{person} had a habit of humming along with {sound}.",
    "{opener}, {animal} would appear whenever {weather} was on its way.",
    "There were {plant} in every ditch from {place} to {place}.",
    "{person} {verb_work} {thing} and then, after a moment's thought, {verb_work} it again.",
    "It is hard to describe {light} on {place}, or the {texture} smell of {plant} that came with it.",
    "{opener}, we were {adj} with our money and generous with our time.",
    "The walls of {place} were {material} below and {material} above.",
    "{person} said that {season} was the only honest season of the year.",
    "{opener}, {thing} hung on a nail by the fire, ready for {time}.",
    "{animal} nested in the eaves every year, and every year {person} let it be.",
    "We walked home through {place} with {thing} and very little to say.",
    "{opener}, the river rose after {weather}, then fell again just as quickly.",
    "{person} measured everything twice and cut the {material} only once.",
    "On the far side of {place} the ground turned {texture} and treacherous.",
    "{opener}, {sound} was the first thing we heard {time}.",
    "{person} was {adj} and {adj}, and most people liked that combination.",
    "{plant} and {plant} crowded the bank below {place}.",
    "{opener}, {feeling} is good for anyone who works with {material}.",
    "It was {weather} the day {person} finally finished {thing}.",
    "The shed smelled of {material}, oil and {plant}.",
    "{opener}, the talk at the inn turned to {season} and what it might bring.",
    "{person} taught the apprentices to respect {material} and to fear nothing else.",
    "{animal} left tracks across {place} that were gone by {light}.",
]

# Short paragraph openers that set a scene, so paragraphs read as little essays.
OPEN = [
    "This is how {season} went at {place}.",
    "I want to write down what I remember of {place}.",
    "There is not much to say about {person}, and yet a great deal.",
    "Some notes on working with {material}.",
    "A word about {weather}, since it ruled everything.",
    "The year began, as it often did, with {weather}.",
    "Of all the places we knew, {place} was the one we returned to.",
    "It is worth describing an ordinary day at {place}.",
]

SENT_END = re.compile(r"[.!?]$")


def fill(rng: random.Random, template: str) -> str:
    def pick(m: re.Match) -> str:
        return rng.choice(W[m.group(1)].split("|"))

    s = re.sub(r"\{(\w+)\}", pick, template)
    s = re.sub(r"\b([Aa]) (?=[aeiou])", r"\1n ", s)  # "a unhurried" -> "an unhurried"
    return s[0].upper() + s[1:]


def fresh(rng: random.Random, templates: list[str], seen: set[str]) -> str:
    """A filled sentence not used before (redraws; never repeats a sentence)."""
    for _ in range(200):
        s = fill(rng, rng.choice(templates))
        if s not in seen:
            seen.add(s)
            return s
    raise RuntimeError("templates exhausted; add more or lower `chars`")


def paragraph(rng: random.Random, seen: set[str]) -> str:
    sents = []
    if rng.random() < 0.35:  # a scene-setting opener, unless this one was used already
        opener = fill(rng, rng.choice(OPEN))
        if opener not in seen:
            seen.add(opener)
            sents.append(opener)
    for _ in range(rng.randint(4, 9)):
        sents.append(fresh(rng, T, seen))
    return " ".join(sents)


def generate(chars: int = 800_000, seed: int = 20261129) -> str:
    rng = random.Random(seed)
    seen: set[str] = set()
    paras: list[str] = []
    total = 0
    while total < chars:
        p = paragraph(rng, seen)
        paras.append(p)
        total += len(p) + 2
    text = "\n\n".join(paras) + "\n"
    assert not re.search(r"\d", text), "the corpus must hold no digits (needle values are digits)"
    return text


if __name__ == "__main__":
    sys.stdout.write(generate())
