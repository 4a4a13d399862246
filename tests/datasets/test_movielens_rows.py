"""TorchRec's MovieLens row readers: typed ratings, optionally joined with their movie."""

from rectrain.datasets.movielens import movielens_20m, movielens_25m


def _root(tmp_path):
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,10,4.5,99\n2,11,bad,7\n")
    (tmp_path / "movies.csv").write_text('movieId,title,genres\n10,"Heat, 1995",Action\n11,Up,Animation\n')
    return str(tmp_path)


def test_ratings_are_typed_and_bad_numbers_become_zero(tmp_path):
    rows = list(movielens_20m(_root(tmp_path)))
    assert rows == [
        {"userId": 1, "movieId": 10, "rating": 4.5, "timestamp": 99},
        {"userId": 2, "movieId": 11, "rating": 0.0, "timestamp": 7},
    ]


def test_movies_join_keeps_quoted_titles_whole(tmp_path):
    rows = list(movielens_25m(_root(tmp_path), include_movies_data=True))
    assert rows[0]["title"] == "Heat, 1995" and rows[1]["genres"] == "Animation"
    raw = list(movielens_25m(_root(tmp_path), row_mapper=None))
    assert raw[0] == ["1", "10", "4.5", "99"]
