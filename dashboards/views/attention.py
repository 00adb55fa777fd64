"""attention page: being built."""
import streamlit as st

st.header("attention")
st.info("This page is being built.")
